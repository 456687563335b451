"""feature_groups: each item its own group, or the batch's segments renumbered per row."""

from __future__ import annotations

import torch

from attnaudit.data.types import Batch
from attnaudit.explain.helpers.features import feature_groups


def test_each_item_its_own_group(tiny_transformer_run) -> None:
    model = tiny_transformer_run.model
    batch = Batch(tokens=torch.tensor([[5, 6, 7], [5, 6, 0]]), mask=torch.tensor([[1, 1, 1], [1, 1, 0]]).bool())
    assert feature_groups(model, batch).tolist() == [[0, 1, 2], [0, 1, -1]]


def test_segments_renumbered_and_template_left_out(tiny_transformer_run) -> None:
    model = tiny_transformer_run.model
    batch = Batch(
        tokens=torch.tensor([[5, 6, 7, 8]]),
        mask=torch.tensor([[1, 1, 1, 1]]).bool(),
        items=torch.tensor([[0, 1, 1, 1]]).bool(),
        segments=torch.tensor([[9, 4, 4, 7]]),
    )
    assert feature_groups(model, batch).tolist() == [[-1, 0, 0, 1]]
