"""``value_zeroing``: Value Zeroing (Mohebbi et al. 2023). In layer ``l``, token ``j``'s value vector is
zeroed in every head and the layer is run again; ``C_ij`` is the cosine distance between token ``i``'s
output of the layer (after its feed-forward block) and the original. Rows are normalised to 1 and the
maps rolled out through the layers.

Zeroing ``v_j`` leaves the attention weights alone and removes exactly ``Σ_h α^h_ij f_h(x_j)`` from the
sum the attention block adds up for token ``i`` (Kobayashi et al. 2021's shares,
:func:`~attnaudit.explain.helpers.residual.residual_parts`). So the zeroed layer is never rerun as a whole:
each (query, zeroed key) pair of real tokens takes that sum minus one share through the rest of the
layer (norms and feed-forward map), all pairs of a layer at once, instead of one rerun of the
remaining layers per zeroed token."""

from __future__ import annotations

import torch
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.explain.helpers.residual import layers_up_to, pair_mask, residual_parts, rolled_contributions, token_map
from attnaudit.explain.helpers.rollout import explained_record
from attnaudit.explain.registry import explanation
from attnaudit.models.interface import (
    AttentionLayer,
    AttentionModel,
    ResidualNorms,
    evaluation,
)

ROWS = 8192
"""Vectors taken through a layer's feed-forward map at once, at most: bounds memory."""


def layer_output(norms: ResidualNorms, summed: Tensor, x: Tensor) -> Tensor:
    """A layer's output from the attention block's summed input to its first residual ``(..., d)`` (``x + o``,
    ``x`` the residual stream), by the layout's own equation (:meth:`~attnaudit.models.interface.ResidualNorms.output`),
    :data:`ROWS` vectors at a time."""
    return torch.cat([norms.output(part, residual) for part, residual in zip(summed.split(ROWS), x.split(ROWS))])


def zeroing_map(model: AttentionModel, record: AttentionLayer, layer: int) -> Tensor:
    """``C_ij = 1 − cos(out_i, out_i without v_j)`` ``(B,Q,K)`` of one layer, 0 outside real pairs."""
    norms = model.residual_norms(layer)
    parts, whole = residual_parts(model, record, layer)  # parts_ij = Σ_h α^h_ij f_h(x_j) + δ_ij x_i
    x = model.residual_stream(record)
    b, q, k = pair_mask(record).bool().nonzero(as_tuple=True)
    removed = parts[b, q, k] - (q == k).to(x.dtype)[:, None] * x[b, q]  # Σ_h α^h_ij f_h(x_j): what zeroing v_j takes away
    original = layer_output(norms, whole.reshape(-1, whole.shape[-1]), x.reshape(-1, x.shape[-1])).view_as(whole)
    changed = layer_output(norms, whole[b, q] - removed, x[b, q])
    out = torch.zeros(parts.shape[:3], dtype=parts.dtype, device=parts.device)
    out[b, q, k] = cosine_distance(original[b, q], changed)
    return out


def cosine_distance(a: Tensor, b: Tensor) -> Tensor:
    """``1 − cos(a, b)`` over the last axis as ``‖â − b̂‖² / 2`` (unit vectors), which is the same number: zeroing one
    value vector moves a layer's output only slightly, and ``1 − cos`` computed from the dot product then loses the
    digits that matter (in float32 a fine-tuned MiniLM's scores were off by up to 8 % of the largest one against float64;
    with the difference of the unit vectors, by 3·10⁻⁷)."""
    unit_a, unit_b = torch.nn.functional.normalize(a, dim=-1), torch.nn.functional.normalize(b, dim=-1)
    return 0.5 * (unit_a - unit_b).square().sum(-1)


@explanation(
    "value_zeroing", "Value Zeroing: output change when a token's value vector is zeroed, rolled out (Mohebbi et al. 2023)",
    ("value_zeroing",), default=False, order=59,
)
def value_zeroing(model: AttentionModel, batch: Batch) -> Tensor:
    """Value Zeroing scores ``(B,K)``: per-layer cosine-distance maps, rows normalised to 1, rolled out
    to the explained layer and read at the explanation query."""
    with evaluation(model), torch.no_grad():
        trace, index, record = explained_record(model, batch)
        maps = [token_map(zeroing_map, model, r, layer) for layer, r in layers_up_to(trace, index)]
    return rolled_contributions(model, batch, maps, record)
