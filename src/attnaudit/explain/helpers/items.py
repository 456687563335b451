"""Batches with some items removed, compacted (leave-one-out, ERASER)."""

from __future__ import annotations

import torch
from torch import Tensor

from attnaudit.data.types import Batch


def compact_items(batch: Batch, index: Tensor, keep: Tensor, pad_id: int) -> Batch:
    """Instances ``index`` of ``batch`` with only the items in ``keep`` ``(R, K)``, shifted left.

    This is what "removing" an item means: later tokens move up one position (the
    Transformer's positions and the CNN's windows change accordingly). Items are tokens,
    or whole sentences for hierarchical ``(B,S,W)`` tokens. The query (and a forced target) is kept unchanged.
    """
    tokens, mask = batch.tokens[index], batch.mask[index].bool()
    count = keep.sum(1)
    width = max(int(count.max()), 1)
    order = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices[:, :width]
    valid = torch.arange(width, device=keep.device)[None, :] < count[:, None]
    features = None
    if tokens.dim() == 3:
        gather = order[:, :, None].expand(-1, -1, tokens.shape[2])
        tokens, mask = tokens.gather(1, gather), mask.gather(1, gather) & valid[:, :, None]
    else:
        tokens, mask = tokens.gather(1, order), valid
        if batch.features is not None:
            features = batch.features[index].gather(1, order).masked_fill(~mask, 0)
    return Batch(
        tokens=tokens.masked_fill(~mask, pad_id),
        mask=mask,
        features=features,
        query=None if batch.query is None else batch.query[index],
        query_mask=None if batch.query_mask is None else batch.query_mask[index],
        target=None if batch.target is None else batch.target[index],  # an encoder-decoder's forced target stays
        target_mask=None if batch.target_mask is None else batch.target_mask[index],
    )
