"""What several explanation methods (and the tests) compute alike, as Captum's ``_utils``: ``attention`` (the
explained attention rows), ``rollout`` (the unperturbed trace and its layers' weights), ``norms`` (Kobayashi et al.'s
transformed inputs and norms), ``residual`` (attention + residual + layer-norm decompositions), ``gradients``
(the decision's gradient), ``lrp`` (relevance by the LRP rules) and ``items`` (batches without some items)."""
