"""Kobayashi et al. (2020)'s transformed inputs ``f(x)`` and the norms ``||alpha f(x)||`` of one layer."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

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
