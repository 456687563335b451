"""The gradient of the explained decision with respect to the input embeddings."""

from __future__ import annotations

import torch
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.explain.registry import choice, decision_score, decision_values
from attnaudit.models.interface import AttentionModel, evaluation


def decision_gradient(model: AttentionModel, batch: Batch, score: str = "logit") -> tuple[Tensor, Tensor]:
    """``(embeddings, ∂s/∂embeddings)``: the gradient of each example's decision score ``s`` (its explained
    class's logit or probability, ``score``, minus its contrast's) with respect to its input embeddings,
    attention live (under whatever backward rules are active)."""
    score = choice("score", score)
    with evaluation(model), torch.enable_grad():
        embeddings = model.embed(batch).detach().requires_grad_(True)
        values = decision_values(model.logits_forward(batch, embeddings=embeddings), score)
        (grad,) = torch.autograd.grad(decision_score(batch, values).sum(), embeddings)
    return embeddings.detach(), grad
