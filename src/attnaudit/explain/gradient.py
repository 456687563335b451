"""``gradient``: Jain & Wallace's gradient ``|Σ_d ∂ŷ/∂e_{t,d} · e_{t,d}|`` with attention detached."""

from __future__ import annotations

import torch
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.explain.registry import check_task, decision_score, explanation, token_scores
from attnaudit.models.interface import AttentionModel, detach_weights, evaluation


@explanation(
    "gradient", "|Σ_d ∂ŷ/∂e·e| per token with attention detached (Jain & Wallace 2019)", ("prediction", "gradients"), order=20
)
def gradient_importance(model: AttentionModel, batch: Batch) -> Tensor:
    """Jain & Wallace's gradient: ``|Σ_d ∂ŷ/∂e_{t,d} · e_{t,d}|`` per token, ``(B, K)``.

    Every attention layer is detached (treated as a constant), so the gradient flows only
    through the values. HAN: the token scores of a sentence are summed. Pair Transformers
    embed text and query together; only the text (passage) positions are returned.
    """
    check_task(model)
    with evaluation(model), torch.enable_grad():
        embeddings = model.embed(batch).detach().requires_grad_(True)
        probs = model(batch, [detach_weights()], embeddings=embeddings).probs
        (grad,) = torch.autograd.grad(decision_score(batch, probs).sum(), embeddings)
    return token_scores((grad * embeddings).sum(-1).detach(), model, batch, absolute=True)
