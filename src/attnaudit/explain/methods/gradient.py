"""``gradient``: Jain & Wallace's gradient ``|Σ_d ∂ŷ/∂e_{t,d} · e_{t,d}|`` with attention detached."""

from __future__ import annotations

import torch
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.explain.registry import check_task, choice, decision_score, decision_values, explanation, reduce_dimensions
from attnaudit.models.interface import AttentionModel, detach_weights, evaluation


@explanation(
    "gradient", "|Σ_d ∂ŷ/∂e·e| per token with attention detached (Jain & Wallace 2019)", ("prediction", "gradients"), order=20,
    target_side=True,
)
def gradient_importance(
    model: AttentionModel, batch: Batch, reduction: str = "abs_sum", score: str = "probability", attention: str = "detached",
) -> Tensor:
    """Jain & Wallace's gradient: ``|Σ_d ∂ŷ/∂e_{t,d} · e_{t,d}|`` per token, ``(B, K)``.

    Every attention layer is detached (treated as a constant), so the gradient flows only
    through the values. HAN: the token scores of a sentence are summed. Pair Transformers
    embed text and query together; only the text (passage) positions are returned.
    ``score``: what is differentiated, ``probability`` (``ŷ``, the default) or ``logit`` (``z_ŷ``; with a
    contrast, the difference to the contrast class's); ``reduction``: how ``∂ŷ/∂e_{t,d} · e_{t,d}`` becomes
    the token's score, ``abs_sum`` ``|Σ_d|`` (the default), ``l2`` ``‖·‖₂`` or ``sum`` ``Σ_d`` (signed).
    ``attention``: ``detached`` (the default, Jain & Wallace's) or ``live``, the gradient through the attention
    weights too: the plain input × gradient (Madsen et al. 2022's ``x ⊙ ∇``, with ``score="logit"``).
    """
    check_task(model)
    reduction, score = choice("reduction", reduction), choice("score", score)  # a bad name fails before any work
    hooks = [detach_weights()] if choice("attention", attention) == "detached" else []
    with evaluation(model), torch.enable_grad():
        embeddings = model.embed(batch).detach().requires_grad_(True)
        values = decision_values(model.logits_forward(batch, hooks, embeddings=embeddings), score)
        (grad,) = torch.autograd.grad(decision_score(batch, values).sum(), embeddings)
    return reduce_dimensions((grad * embeddings).detach(), model, batch, reduction)
