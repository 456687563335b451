"""``norms``: Kobayashi et al. (2020)'s head-summed contribution ``‖Σ_h α^h_ij f_h(x_j)‖`` of the
explained layer, read at the explanation query; the norm analysis itself lives here too."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.explain.attention_rollout import explained_record
from attnaudit.explain.registry import explanation, on_items, query_row
from attnaudit.models.interface import AttentionLayer, AttentionModel


@dataclass
class LayerNorms:
    """One layer's quantities: α ``(B,H,Q,K)``, ``‖f_h(x_j)‖`` ``(B,H,K)``, head-summed norm ``(B,Q,K)``."""

    weights: Tensor
    fx_norm: Tensor
    summed_norm: Tensor

    @property
    def weighted_norm(self) -> Tensor:
        """``‖α_ij f_h(x_j)‖ = α_ij ‖f_h(x_j)‖`` per head, ``(B,H,Q,K)``."""
        return self.weights * self.fx_norm[:, :, None, :]


def transformed_inputs(model: AttentionModel, record: AttentionLayer, layer: int) -> Tensor:
    """``f_h(x_j) = (x_j W_V + b_V)|_h W_O|_h`` for every head and key, ``(B,H,K,d)``."""
    w_v, b_v, w_o, heads = model.value_output_maps(layer)
    b, k, d = record.inputs.shape
    dh = w_v.shape[1] // heads
    values = (record.inputs @ w_v + b_v).view(b, k, heads, dh)
    return torch.einsum("bkhe,hed->bhkd", values, w_o.reshape(heads, dh, -1))


def layer_norms(model: AttentionModel, record: AttentionLayer, layer: int) -> LayerNorms:
    """α, ``‖f(x)‖`` and the head-summed contribution norm of one recorded layer."""
    f = transformed_inputs(model, record, layer)
    weights = record.weights
    gram = torch.einsum("bhkd,bgkd->bkhg", f, f)  # (B,K,H,H)
    mixed = torch.einsum("bhqk,bkhg->bgqk", weights, gram)  # (B,H,Q,K)
    squared = (mixed * weights).sum(1).clamp_min(0.0)  # α^T G α, (B,Q,K)
    return LayerNorms(weights=weights, fx_norm=f.norm(dim=-1), summed_norm=squared.sqrt())


@explanation(
    "norms", "‖Σ_h α f_h(x)‖ of the explained layer, the head-summed contribution norm (Kobayashi et al. 2020)",
    ("value_output",), order=55,
)
def norm_importance(model: AttentionModel, batch: Batch) -> Tensor:
    """Kobayashi et al.'s head-summed contribution ``‖Σ_h α^h_ij f_h(x_j)‖`` of the explained layer, ``(B,K)``."""
    _, index, record = explained_record(model, batch)
    with torch.no_grad():
        norms = layer_norms(model, record, index).summed_norm
    return on_items(model, batch, query_row(model, norms, record.query_mask))
