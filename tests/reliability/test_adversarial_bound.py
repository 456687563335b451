"""Property tests of the adversarial search's bound check (``attnaudit.experiments.adversarial``).

``tests/experiments/test_adversarial.py`` compares ``max_valid_jsd`` with a reference on random
arrays; these add the properties a reader of the numbers relies on: the reported JSD always
belongs to an adversary within the bound, loosening the bound never lowers what is reported,
adversaries outside the bound cannot change it, and the adversarial distributions stay valid
(finite, summing to one over real items, zero on padding) whatever the logits.
"""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnaudit.algorithms.metrics import LN2
from attnaudit.experiments.attention_search import adversary_weights, max_valid_jsd

change_value = st.one_of(st.floats(0.0, 1.0), st.just(math.nan))


@st.composite
def outcomes(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    """(JSD, output change) arrays ``(N, A)``; changes may be NaN (a failed decode)."""
    n, a = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    div = draw(st.lists(st.floats(0.0, LN2), min_size=n * a, max_size=n * a))
    change = draw(st.lists(change_value, min_size=n * a, max_size=n * a))
    return torch.tensor(div, dtype=torch.float64).view(n, a), torch.tensor(change, dtype=torch.float64).view(n, a)


@settings(max_examples=80, deadline=None)
@given(outcomes(), st.floats(0.0, 0.5), st.floats(0.0, 0.5))
def test_reported_jsd_is_a_valid_adversarys_and_grows_with_the_bound(
    arrays: tuple[torch.Tensor, torch.Tensor], bound: float, extra: float
) -> None:
    div, change = arrays
    best, count = max_valid_jsd(div, change, bound)
    for i in range(div.shape[0]):
        valid = [float(d) for d, c in zip(div[i], change[i]) if c <= bound]
        assert int(count[i]) == len(valid)
        if valid:
            assert float(best[i]) in valid and float(best[i]) == max(valid)
        else:
            assert math.isnan(float(best[i]))
    looser, looser_count = max_valid_jsd(div, change, bound + extra)
    assert torch.all(looser_count >= count)
    defined = ~torch.isnan(best)
    assert torch.all(looser[defined] >= best[defined])


@settings(max_examples=60, deadline=None)
@given(outcomes(), st.floats(0.0, 0.2), st.floats(0.0, LN2), st.floats(1e-6, 1.0))
def test_adversaries_outside_the_bound_change_nothing(
    arrays: tuple[torch.Tensor, torch.Tensor], bound: float, jsd_value: float, excess: float
) -> None:
    div, change = arrays
    extra_div = torch.full((div.shape[0], 1), jsd_value, dtype=torch.float64)
    extra_change = torch.full((div.shape[0], 1), bound + excess, dtype=torch.float64)
    before = max_valid_jsd(div, change, bound)
    after = max_valid_jsd(torch.cat([div, extra_div], 1), torch.cat([change, extra_change], 1), bound)
    torch.testing.assert_close(after[0], before[0], equal_nan=True)
    assert torch.equal(after[1], before[1])


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 3), st.floats(-1e30, 1e30, allow_nan=False), st.integers(0, 2**31 - 1))
def test_adversarial_distributions_stay_valid_for_any_logits(keys: int, heads: int, scale: float, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    real = torch.ones(1, keys + 2, dtype=torch.bool)
    real[0, keys:] = False  # two padding items
    queries = torch.ones(1, 1, dtype=torch.bool)
    theta = torch.randn(1, 3, heads, 1, keys + 2, generator=g, dtype=torch.float64) * scale
    original = torch.zeros(1, heads, 1, keys + 2, dtype=torch.float64)
    original[..., :keys] = 1.0 / keys
    weights = adversary_weights(theta, real, queries, original)
    assert torch.isfinite(weights).all()
    assert torch.all(weights[..., keys:] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights.sum(-1)))
