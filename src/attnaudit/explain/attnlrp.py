"""``attnlrp``: AttnLRP (Achtibat et al., ICML 2024, "AttnLRP: Attention-Aware Layer-Wise Relevance
Propagation for Transformers"). The relevance of token ``t`` is ``Σ_d e_{t,d} · ∂̃z_ŷ/∂e_{t,d}``: input ×
gradient of the predicted class's logit on a backward pass whose rules are changed
(:mod:`attnaudit.models.lrp`): the ε-rule on linear layers (their plain gradient), the identity rule on
normalisations (denominator constant) and elementwise activations, the uniform rule on the products
``Q Kᵀ``, ``A V`` and Llama's gate, and the softmax's own gradient. Signed; one backward pass.

The relevances do not add up to the logit: biases keep their shares, and the softmax rule gives part of
the relevance to the softmax's bias term (by design, as in the authors' library ``lxt``)."""

from __future__ import annotations

from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.explain.input_gradient import decision_gradient
from attnaudit.explain.registry import check_task, explanation, token_scores
from attnaudit.models.interface import AttentionModel
from attnaudit.models.lrp import relevance_rules


def lrp_relevance(model: AttentionModel, batch: Batch, rule: str) -> Tensor:
    """Input × modified gradient of the predicted logit under ``rule`` (``attnlrp``, ``cp_lrp``),
    summed over the embedding dimension: ``(B, T)`` over the model's embedded tokens."""
    check_task(model)
    with relevance_rules(model, rule):
        embeddings, grad = decision_gradient(model, batch, "logit")
    return (embeddings * grad).sum(-1)


@explanation(
    "attnlrp",
    "AttnLRP: input × gradient of the predicted logit under LRP rules for softmax, A·V and norms (Achtibat et al. 2024)",
    ("prediction", "gradients", "lrp"),
    default=False,
    order=64,
)
def attnlrp(model: AttentionModel, batch: Batch) -> Tensor:
    """AttnLRP relevance of each item, signed, ``(B, K)``."""
    return token_scores(lrp_relevance(model, batch, "attnlrp"), model, batch, absolute=False)
