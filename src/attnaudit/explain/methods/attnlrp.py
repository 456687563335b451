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
from attnaudit.explain.helpers.lrp import lrp_relevance
from attnaudit.explain.registry import explanation, token_scores
from attnaudit.models.interface import AttentionModel


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
