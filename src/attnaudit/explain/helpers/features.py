"""The features a perturbation or grouped explanation works with: groups of explained items.

Captum's ``feature_mask`` convention: every item of one group is perturbed together (removed, masked or
replaced as one unit) and carries the group's attribution. Without segments (``Batch.segments`` None) each
item is a group of its own.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.explain.helpers.items import item_mask
from attnaudit.models.interface import AttentionModel


def feature_groups(model: AttentionModel, batch: Batch) -> Tensor:
    """``(B, K)`` long: each explained item's group, numbered 0, 1, ... in position order per row; -1 where
    there is no item (padding, a prompt's template). ``Batch.segments`` gives the groups where set (a
    segment's items share its number); otherwise every item is its own group."""
    mask = item_mask(model, batch)
    if batch.segments is not None and batch.segments.shape == mask.shape:
        segments = batch.segments.to(mask.device).masked_fill(~mask, -1)
        return torch.stack([_renumber(row) for row in segments])
    order = mask.long().cumsum(1) - 1
    return order.masked_fill(~mask, -1)


def _renumber(row: Tensor) -> Tensor:
    """Group ids of one row made consecutive (0, 1, ...) in order of first appearance, -1 kept."""
    out = torch.full_like(row, -1)
    seen: dict[int, int] = {}
    for position, value in enumerate(row.tolist()):
        if value >= 0:
            out[position] = seen.setdefault(value, len(seen))
    return out


def group_members(selected: Tensor, groups: Tensor) -> Tensor:
    """``(B, K)`` True at every item whose group (``groups``, :func:`feature_groups`) has an item in ``selected``: a
    choice made among the groups' first items (:func:`~attnaudit.explain.registry.first_items`) spread over whole groups."""
    chosen = torch.where(selected & (groups >= 0), groups, torch.full_like(groups, -2))
    return (groups[:, :, None] == chosen[:, None, :]).any(-1) & (groups >= 0)
