"""``input_gradient``: Abnar & Zuidema's input gradient ``|Σ_d ∂z_ŷ/∂e_{t,d}|`` (predicted logit, attention live)."""

from __future__ import annotations

import torch
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.explain.registry import choice, decision_score, decision_values, explanation, reduce_dimensions
from attnaudit.models.interface import AttentionModel, evaluation


@explanation(
    "input_gradient",
    "|Σ_d ∂z_ŷ/∂e| of the predicted logit, attention live (Abnar & Zuidema 2020's input gradients)",
    ("prediction", "gradients"),
    default=False,
    order=80,
    target_side=True,
)
def input_gradient(model: AttentionModel, batch: Batch, reduction: str = "abs_sum", score: str = "logit") -> Tensor:
    """Abnar & Zuidema's input gradient ``|Σ_d ∂z_ŷ/∂e_{t,d}|``, ``(B, K)``; HAN sums a sentence's tokens.

    ``score``: what is differentiated, ``logit`` (``z_ŷ``, the default) or ``probability`` (``ŷ``); with a
    contrast, the difference to the contrast class's. ``reduction``: how the gradient ``∂/∂e_{t,d}`` becomes
    the token's score, ``abs_sum`` ``|Σ_d|`` (the default), ``l2`` ``‖·‖₂`` or ``sum`` ``Σ_d`` (signed).
    ``score="probability", reduction="l2"`` is inseq's ``saliency`` before its normalisation over tokens.
    """
    reduction = choice("reduction", reduction)  # a bad name fails before any work
    _, grad = decision_gradient(model, batch, score)
    return reduce_dimensions(grad, model, batch, reduction)


def decision_gradient(model: AttentionModel, batch: Batch, score: str = "logit") -> tuple[Tensor, Tensor]:
    """``(embeddings, ∂s/∂embeddings)``: the gradient of each example's decision score ``s`` (its explained
    class's logit or probability, ``score``, minus its contrast's) with respect to its input embeddings,
    attention live (under whatever backward rules are active)."""
    score = choice("score", score)
    with evaluation(model), torch.enable_grad():
        embeddings = model.embed(batch).detach().requires_grad_(True)
        values = decision_values(model(batch, embeddings=embeddings), score)
        (grad,) = torch.autograd.grad(decision_score(batch, values).sum(), embeddings)
    return embeddings.detach(), grad

