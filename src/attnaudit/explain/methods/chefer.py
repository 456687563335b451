"""``chefer``: gradient-weighted attention rollout (Chefer et al. 2021, "Generic Attention-model
Explainability"). With ``A^l`` every layer's attention and ``∇A^l = ∂z_ŷ/∂A^l`` (the predicted
class's logit, backpropagated through the whole model), ``Ā^l = mean_h (∇A^l ⊙ A^l)⁺`` and
``R ← R + Ā^l R`` from ``R = I``, up to the explained layer, read at the explanation query."""

from __future__ import annotations

import torch
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.explain.registry import check_task, decision_score, explanation, on_items, query_row
from attnaudit.models.interface import AttentionModel, Intervention, evaluation


def relevance(weights: list[Tensor], grads: list[Tensor]) -> Tensor:
    """``R = Π_l (I + Ā^l)`` applied in layer order, ``Ā^l = mean_h (∇A^l ⊙ A^l)⁺``; ``(B,T,T)``."""
    t = weights[0].shape[-1]
    r = torch.eye(t, dtype=weights[0].dtype, device=weights[0].device).expand(weights[0].shape[0], t, t)
    for a, g in zip(weights, grads):
        r = r + (g * a).clamp_min(0.0).mean(1) @ r
    return r


@explanation(
    "chefer", "gradient-weighted attention rollout R ← R + mean_h (∇A ⊙ A)⁺ R (Chefer et al. 2021)",
    ("prediction", "gradients", "self_attention"), default=False, order=62,
)
def chefer(model: AttentionModel, batch: Batch) -> Tensor:
    """Chefer et al.'s relevance of each input token at the explanation query, ``(B,K)``."""
    check_task(model)
    seen: list[Tensor] = []

    def keep(weights: Tensor, _mask: Tensor) -> Tensor:
        seen.append(weights)
        return weights

    with evaluation(model), torch.enable_grad():
        out = model(batch, [Intervention(weights=keep)])
        logit = decision_score(batch, out.logits).sum()
        index = model.explained_layer % len(out.trace)
        grads = torch.autograd.grad(logit, seen[: index + 1])
    record = out.trace[index]
    rolled = relevance([w.detach() for w in seen[: index + 1]], list(grads))
    return on_items(model, batch, query_row(model, rolled, record.query_mask))
