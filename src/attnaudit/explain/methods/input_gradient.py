"""``input_gradient``: Abnar & Zuidema's input gradient ``|Σ_d ∂z_ŷ/∂e_{t,d}|`` (predicted logit, attention live)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.explain.helpers.gradients import decision_gradient
from attnaudit.explain.registry import choice, explanation, reduce_dimensions
from attnaudit.models.interface import AttentionModel


def summed_gradient_vanishes(model: AttentionModel, settings: dict[str, Any]) -> str | None:
    """Why ``Σ_d`` of this method's gradient means nothing on ``model``: every path from the input embeddings to the
    decision passes a LayerNorm (BERT's family: the embedding norm; GPT-2: each block's and the final one), which
    ignores a shift shared by every dimension, so the gradient sums to 0 over them and ``|Σ_d|`` is float rounding
    (on a fine-tuned MiniLM at most 4·10⁻⁸ of ``Σ_d |∂z/∂e|``); ``l2`` measures the same gradient and stays."""
    if settings.get("reduction") in ("abs_sum", "sum") and model.embeddings_shift_invariant():
        return ("its input embeddings reach the decision only through LayerNorms, which ignore a shift of every dimension, so "
                "Σ_d ∂z/∂e is 0 up to float rounding and |Σ_d| would rank noise; use reduction l2 (--reduction l2)")
    return None


@explanation(
    "input_gradient",
    "|Σ_d ∂z_ŷ/∂e| of the predicted logit, attention live (Abnar & Zuidema 2020's input gradients)",
    ("prediction", "gradients"),
    default=False,
    order=80,
    target_side=True,
    settings_check=summed_gradient_vanishes,
)
def input_gradient(model: AttentionModel, batch: Batch, reduction: str = "abs_sum", score: str = "logit") -> Tensor:
    """Abnar & Zuidema's input gradient ``|Σ_d ∂z_ŷ/∂e_{t,d}|``, ``(B, K)``; HAN sums a sentence's tokens.

    ``score``: what is differentiated, ``logit`` (``z_ŷ``, the default) or ``probability`` (``ŷ``); with a
    contrast, the difference to the contrast class's. ``reduction``: how the gradient ``∂/∂e_{t,d}`` becomes
    the token's score, ``abs_sum`` ``|Σ_d|`` (the default), ``l2`` ``‖·‖₂`` or ``sum`` ``Σ_d`` (signed).
    ``score="probability", reduction="l2"`` is inseq's ``saliency`` before its normalisation over tokens.
    ``abs_sum`` and ``sum`` do not apply where a LayerNorm reads the embeddings first (:func:`summed_gradient_vanishes`).
    """
    reduction = choice("reduction", reduction)  # a bad name fails before any work
    _, grad = decision_gradient(model, batch, score)
    return reduce_dimensions(grad, model, batch, reduction)



