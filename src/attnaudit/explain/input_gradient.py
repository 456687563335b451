"""``input_gradient``: Abnar & Zuidema's input gradient ``|Σ_d ∂z_ŷ/∂e_{t,d}|`` (predicted logit, attention live)."""

from __future__ import annotations

import torch
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.explain.registry import decision_score, explanation, token_scores
from attnaudit.models.interface import AttentionModel, evaluation


@explanation(
    "input_gradient",
    "|Σ_d ∂z_ŷ/∂e| of the predicted logit, attention live (Abnar & Zuidema 2020's input gradients)",
    ("prediction", "gradients"),
    default=False,
    order=80,
)
def input_gradient(model: AttentionModel, batch: Batch) -> Tensor:
    """Abnar & Zuidema's input gradient ``|Σ_d ∂z_ŷ/∂e_{t,d}|``, ``(B, K)``; HAN sums a sentence's tokens."""
    _, grad = predicted_logit_gradient(model, batch)
    return token_scores(grad.sum(-1), model, batch, absolute=True)


def predicted_logit_gradient(model: AttentionModel, batch: Batch) -> tuple[Tensor, Tensor]:
    """``(embeddings, ∂z_ŷ/∂embeddings)``: the gradient of each example's predicted logit with
    respect to its input embeddings, attention live (under whatever backward rules are active)."""
    with evaluation(model), torch.enable_grad():
        embeddings = model.embed(batch).detach().requires_grad_(True)
        logits = model(batch, embeddings=embeddings).logits
        chosen = decision_score(batch, logits).sum()
        (grad,) = torch.autograd.grad(chosen, embeddings)
    return embeddings.detach(), grad
