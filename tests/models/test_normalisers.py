"""attnaudit.models.normalisers: scores that already carry a model's additive mask normalise as masked scores do."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnaudit.models.normalisers import normalise


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**16), queries=st.integers(1, 6), keys=st.integers(1, 7),
    dtype=st.sampled_from([torch.float32, torch.float64]), scale=st.sampled_from([0.1, 1.0, 30.0]),
)
def test_premasked_softmax_is_the_masked_softmax(seed: int, queries: int, keys: int, dtype: torch.dtype, scale: float) -> None:
    """A model adds its dtype's minimum at hidden keys; the softmax of those scores (no fill) is the filled one bit for
    bit, rows that read no key are zeros in both, and every other row sums to one over its readable keys."""
    generator = torch.Generator().manual_seed(seed)
    raw = torch.randn(2, 3, queries, keys, generator=generator, dtype=dtype) * scale
    allowed = torch.rand(2, 1, queries, keys, generator=generator) < 0.6
    scores = raw + torch.zeros_like(allowed, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    expected = normalise(raw, allowed)
    got = normalise(scores, allowed, masked=True)
    assert torch.equal(got, expected)
    blind = ~allowed.any(-1)
    assert (got.masked_select(~allowed) == 0).all()
    assert (got.sum(-1)[blind.expand(-1, 3, -1)] == 0).all()
    torch.testing.assert_close(got.sum(-1)[~blind.expand(-1, 3, -1)], torch.ones((~blind.expand(-1, 3, -1)).sum(), dtype=dtype))
