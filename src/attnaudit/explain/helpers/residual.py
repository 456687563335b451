"""Attention + residual + layer-norm decompositions (Kobayashi et al. 2021) that GlobEnc, ALTI, DecompX and Value Zeroing share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any

import torch
from torch import Tensor

from attnaudit.algorithms.attention_graph import rollout
from attnaudit.data.types import Batch
from attnaudit.explain.helpers.norms import transformed_inputs
from attnaudit.explain.registry import on_items, query_row
from attnaudit.models.interface import AttentionLayer, AttentionModel, AttentionTrace


def residual_parts(model: AttentionModel, record: AttentionLayer, layer: int) -> tuple[Tensor, Tensor]:
    """``(parts, whole)``: ``Σ_h α^h_ij f_h(x_j) + δ_ij x_i`` ``(B,Q,K,d)``, 0 at padding, and the sum the
    attention block adds up before its norm, ``Σ_j parts_ij + b_O`` ``(B,Q,d)``."""
    norms = model.residual_norms(layer)
    f = transformed_inputs(model, record, layer)  # (B,H,K,d)
    x = model.residual_stream(record)
    eye = torch.eye(x.shape[1], dtype=x.dtype, device=x.device)
    parts = torch.einsum("bhqk,bhkd->bqkd", record.weights, f) + eye[None, :, :, None] * x[:, :, None, :]
    parts = parts * pair_mask(record)[..., None]
    whole = parts.sum(2) if norms.output_bias is None else parts.sum(2) + norms.output_bias
    return parts, whole


def attention_block_parts(model: AttentionModel, record: AttentionLayer, layer: int) -> Tensor:
    """``T_i(x_j)`` ``(B,Q,K,d)``: the share of input token ``j`` in token ``i``'s output of the attention
    block, residual and (post-LN) the first layer norm's linear part included; 0 at padding."""
    parts, whole = residual_parts(model, record, layer)
    return model.residual_norms(layer).attention_shares(parts, whole, lambda: model.residual_stream(record), lambda: pair_mask(record))


def pair_mask(record: AttentionLayer) -> Tensor:
    """``(B,Q,K)`` as the layer's dtype: 1 where both the query and the key are real tokens."""
    query_mask = record.mask if record.query_mask is None else record.query_mask
    return (query_mask[:, :, None] & record.mask[:, None, :]).to(record.inputs.dtype)


def rolled_contributions(model: AttentionModel, batch: Batch, per_layer: list[Tensor], record: AttentionLayer) -> Tensor:
    """Rows of per-layer ``(B,T,T)`` contribution maps normalised to sum 1 over real tokens, multiplied
    up through the layers (``R_l = C_l R_{l−1}``: the residual is inside ``C``, so no ``½I``), then read
    at the explanation query: ``(B,K)``."""
    rolled = rollout([c[:, None] for c in per_layer], residual=0.0, mask=record.mask)[:, -1]
    return on_items(model, batch, query_row(model, rolled, record.query_mask))


ELEMENTS = 2**25
"""Entries of the ``(B,Q,K,d)`` shares computed at once, at most (examples are taken in chunks)."""


def token_map(
    fn: Callable[[AttentionModel, AttentionLayer, int], Tensor], model: AttentionModel, record: AttentionLayer, layer: int
) -> Tensor:
    """``fn(model, record, layer) -> (B,Q,K)`` run a few examples at a time, so that the ``(B,Q,K,d)``
    shares it builds stay under :data:`ELEMENTS` entries."""
    b, t, d = record.inputs.shape
    step = max(1, ELEMENTS // (t * t * d))
    return torch.cat([fn(model, rows(record, slice(i, i + step)), layer) for i in range(0, b, step)])


def rows(record: AttentionLayer, part: slice) -> AttentionLayer:
    """The record of examples ``part`` of the batch (every tensor field sliced on its first axis)."""
    values = {f.name: getattr(record, f.name) for f in fields(record)}
    sliced: dict[str, Any] = {k: v[part] for k, v in values.items() if isinstance(v, Tensor)}
    return replace(record, **sliced)


def layers_up_to(trace: AttentionTrace, index: int) -> list[tuple[int, AttentionLayer]]:
    """``(layer, record)`` of layers ``0 … index``."""
    return list(enumerate(list(trace.layers)[: index + 1]))
