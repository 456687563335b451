"""The random baseline: seeded, uniform in [0, 1) at real items, 0 at padding."""

from __future__ import annotations

import torch

from attnaudit.explain import EXPLANATIONS, item_mask
from attnaudit.explain.methods.random import random_importance


def test_random_scores_are_seeded_and_zero_at_padding(runs: dict) -> None:
    run, batch = runs["han"]
    mask = item_mask(run, batch)
    first = random_importance(run, batch, seed=3)
    torch.testing.assert_close(first, random_importance(run.model, batch, seed=3))
    assert not torch.equal(first, random_importance(run, batch, seed=4))
    assert (first[~mask] == 0).all() and ((first[mask] >= 0) & (first[mask] < 1)).all()
    expected = torch.rand(mask.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64).float() * mask
    torch.testing.assert_close(first, expected)
    torch.testing.assert_close(EXPLANATIONS["random"](run, batch, seed=3, steps=9), first)  # the test's seed reaches it
