"""``cp_lrp``: CP-LRP (Ali et al., ICML 2022, "XAI for Transformers: Better Explanations through
Conservative Propagation"). Input × gradient of the predicted class's logit with the attention weights
and the normalisations' denominators treated as constants, the identity rule on elementwise
activations and the gates of gated feed-forward blocks constant (:mod:`attnaudit.models.lrp`). Signed.

Conservative: on a model without biases (and without additive position embeddings), the token
relevances add up to the explained logit exactly."""

from __future__ import annotations

from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.explain.helpers.lrp import lrp_relevance
from attnaudit.explain.registry import explanation, token_scores
from attnaudit.models.interface import AttentionModel


@explanation(
    "cp_lrp",
    "CP-LRP: input × gradient of the predicted logit with attention and norm denominators constant (Ali et al. 2022)",
    ("prediction", "gradients", "lrp"),
    default=False,
    order=65,
)
def cp_lrp(model: AttentionModel, batch: Batch) -> Tensor:
    """CP-LRP relevance of each item, signed, ``(B, K)``."""
    return token_scores(lrp_relevance(model, batch, "cp_lrp"), model, batch, absolute=False)
