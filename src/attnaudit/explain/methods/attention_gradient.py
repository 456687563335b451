"""``attention_gradient`` and ``gradient_x_attention``: ``∂ŷ/∂α`` and ``α · ∂ŷ/∂α`` on the explained
layer (Serrano & Smith 2019), signed, mean over heads and real queries (or the explanation row)."""

from __future__ import annotations

import torch
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.explain.registry import (
    check_task,
    decision_score,
    explanation,
    layer_index,
    reduce_heads,
    to_items,
)
from attnaudit.models.interface import AttentionModel, Intervention, evaluation


def _attention_grad(model: AttentionModel, batch: Batch) -> tuple[Tensor, Tensor, Tensor | None, int]:
    """``(α, ∂ŷ/∂α, query_mask, layer)`` on the explained layer, each ``(B,H,Q,K)``."""
    check_task(model)
    index = layer_index(model, None)
    with evaluation(model):
        with torch.no_grad():
            record = model(batch).trace[index]
        weights = record.weights.detach().clone().requires_grad_(True)
        with torch.enable_grad():
            probs = model(batch, [Intervention(layer=index, weights=weights)]).probs
            (grad,) = torch.autograd.grad(decision_score(batch, probs).sum(), weights)
    return weights.detach(), grad, record.query_mask, index


@explanation(
    "attention_gradient", "∂ŷ/∂α on the explained layer, signed (Serrano & Smith 2019)", ("prediction", "gradients"),
    default=False, order=60,
)
def attention_gradient(model: AttentionModel, batch: Batch) -> Tensor:
    """Serrano & Smith's gradient w.r.t. attention: ``∂ŷ/∂α`` on the explained layer, ``(B, K)``.

    Signed (positive: more weight on the item raises ``ŷ``); mean over heads and real queries.
    """
    _, grad, query_mask, index = _attention_grad(model, batch)
    return to_items(reduce_heads(grad, query_mask, None, model.explanation_rows(_queries(batch, query_mask))), model, batch, index)


@explanation(
    "gradient_x_attention", "α · ∂ŷ/∂α on the explained layer, signed (Serrano & Smith 2019)", ("prediction", "gradients"),
    default=False, order=61,
)
def gradient_times_attention(model: AttentionModel, batch: Batch) -> Tensor:
    """``α · ∂ŷ/∂α`` on the explained layer (signed), mean over heads and real queries, ``(B, K)``."""
    weights, grad, query_mask, index = _attention_grad(model, batch)
    return to_items(reduce_heads(weights * grad, query_mask, None, model.explanation_rows(_queries(batch, query_mask))), model, batch, index)


def _queries(batch: Batch, query_mask: Tensor | None) -> Tensor:
    """The explained layer's query mask (an encoder-decoder's cross-attention: the decoder's), else the batch's."""
    return query_mask if query_mask is not None else batch.mask
