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
        shared = model.prefix_gradient_forward(batch)
        if shared is not None:  # a generated sequence's steps: one pass over the sequence, one batched backward per row
            sequence, _rows, out = shared
            scores = decision_score(batch, decision_values(out, score))
            (grads,) = torch.autograd.grad(scores, sequence, grad_outputs=torch.eye(len(scores), dtype=scores.dtype, device=scores.device),
                                           is_grads_batched=True)
            # each row's gradient is 0 beyond its own tokens (causal), where its embeddings are padding
            return sequence.detach().expand(len(scores), -1, -1), grads[:, 0]
        embeddings = model.embed(batch).detach().requires_grad_(True)
        values = decision_values(model.logits_forward(batch, embeddings=embeddings), score)
        (grad,) = torch.autograd.grad(decision_score(batch, values).sum(), embeddings)
    return embeddings.detach(), grad
