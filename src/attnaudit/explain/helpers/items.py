"""The explained items of a batch (:func:`item_mask`: tokens, a prompt's ``{text}`` span, HAN's sentences) and
batches with some of them removed, compacted (leave-one-out, ERASER)."""

from __future__ import annotations

import torch
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.models.han import HierarchicalAttentionNetwork
from attnaudit.models.interface import AttentionModel
from attnaudit.run import Run


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


def model_of(target: AttentionModel | Run) -> AttentionModel:
    """The model itself, or a run's model."""
    return target.model if isinstance(target, Run) else target


def hierarchical(model: AttentionModel) -> bool:
    """Whether the explained items are sentences of words (HAN)."""
    return isinstance(model, HierarchicalAttentionNetwork)


def item_mask(target: AttentionModel | Run, batch: Batch) -> Tensor:
    """``(B, K)`` bool, True at the real items of the explained layer (tokens; HAN: sentences;
    a zero-shot prompt: the tokens of its ``{text}`` span, ``Batch.items``)."""
    mask = batch.mask.bool()
    model = model_of(target)
    if hierarchical(model):
        return mask.any(-1)
    if model.target_items and batch.target is not None and batch.target_mask is not None:
        after_start = batch.target_mask.bool().clone()
        after_start[:, 0] = False  # the decoder start token is no earlier target token
        return torch.cat([mask, after_start.to(mask.device)], 1)
    return mask if batch.items is None else mask & batch.items.bool()
