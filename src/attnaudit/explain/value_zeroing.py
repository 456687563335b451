"""``value_zeroing``: Value Zeroing (Mohebbi et al. 2023). In layer ``l``, token ``j``'s value vector is
zeroed in every head and the layer is run again; ``C_ij`` is the cosine distance between token ``i``'s
output of the layer (after its feed-forward block) and the original. Rows are normalised to 1 and the
maps rolled out through the layers. One run of the rest of the model per layer and token: costly."""

from __future__ import annotations

import torch
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.explain.base import explanation
from attnaudit.explain.norms_res_ln import layers_up_to, pair_mask, rolled_contributions
from attnaudit.explain.rollout import explained_record
from attnaudit.models.base import AttentionModel, Cache, Intervention, evaluation


ROWS = 256
"""Copies of the batch run at once (one per zeroed token), at most: bounds memory."""


def zeroing_map(model: AttentionModel, cache: Cache, original: Tensor, layer: int) -> Tensor:
    """``C_ij = 1 − cos(out_i, out_i without v_j)`` ``(B,Q,K)`` for layer ``layer`` restarted from ``cache``.

    Tokens are zeroed a chunk at a time: each example is repeated once per token of the chunk, and
    copy ``c`` has token ``c``'s value vector zeroed in every head (``Intervention(values=...)``)."""
    b, t = cache.states.shape[:2]
    step = max(1, ROWS // b)
    columns = []
    for start in range(0, t, step):
        tokens = torch.arange(start, min(start + step, t))
        n = len(tokens)
        keep = torch.ones(n, t, dtype=cache.states.dtype, device=cache.states.device)
        keep[torch.arange(n), tokens] = 0.0
        keep = keep.repeat(b, 1)  # row e*n + c: example e with token tokens[c] zeroed
        copies = Cache(cache.states.repeat_interleave(n, 0), cache.mask.repeat_interleave(n, 0), layer, dict(cache.extra))
        zeroed = Intervention(layer=layer, values=lambda v, keep=keep: v * keep[:, None, :, None])
        changed = model.decode(copies, [zeroed], start_layer=layer).trace[0].outputs.reshape(b, n, t, -1)
        columns.append(1.0 - torch.nn.functional.cosine_similarity(original[:, None], changed, dim=-1))  # (B,n,Q)
    return torch.cat(columns, 1).transpose(1, 2).clamp_min(0.0)


@explanation(
    "value_zeroing", "Value Zeroing: output change when a token's value vector is zeroed, rolled out (Mohebbi et al. 2023)",
    ("value_zeroing",), default=False, order=59,
)
def value_zeroing(model: AttentionModel, batch: Batch) -> Tensor:
    """Value Zeroing scores ``(B,K)``: per-layer cosine-distance maps, rows normalised to 1, rolled out
    to the explained layer and read at the explanation query."""
    with evaluation(model), torch.no_grad():
        trace, index, record = explained_record(model, batch)
        base = model.encode(batch)
        maps = [
            zeroing_map(model, model.cache_at(trace, layer, base), r.outputs, layer) * pair_mask(r)
            for layer, r in layers_up_to(trace, index)
        ]
    return rolled_contributions(model, batch, maps, record)
