"""RACU (Madsen et al. 2022): hand-computed curves, a plain re-implementation, invariances, the bootstrap."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, stats

from attnaudit.algorithms.racu import mean_interval, racu, racu_areas
from attnaudit.errors import AttnAuditError

RATIOS = list(range(0, 101, 10))


def plain_racu(ratios, method, random) -> float:
    """The definition written out again with scipy's trapezoid rule."""
    x = np.asarray(ratios, float) / 100
    method, random = np.asarray(method, float), np.asarray(random, float)
    between = integrate.trapezoid(random - method, x)
    most = integrate.trapezoid(random - random[-1], x)
    return float(np.clip(between / most, -1, 1))


def test_hand_computed_three_point_curve() -> None:
    # Δp = [0, .2, 0]: ½·.5·(0+.2) + ½·.5·(.2+0) = .1;  Δb = [.4, .2, 0]: ½·.5·(.4+.2) + ½·.5·(.2+0) = .2
    assert racu_areas([0, 50, 100], [0.9, 0.5, 0.5], [0.9, 0.7, 0.5]) == pytest.approx((0.1, 0.2))
    assert racu([0, 50, 100], [0.9, 0.5, 0.5], [0.9, 0.7, 0.5]) == pytest.approx(0.5)


def test_method_equal_to_random_is_zero() -> None:
    random = [0.9, 0.85, 0.8, 0.78, 0.7, 0.66, 0.6, 0.58, 0.55, 0.52, 0.5]
    assert racu(RATIOS, random, random) == 0.0


def test_method_at_the_all_masked_score_is_one_and_a_drop_after_zero_hand_computed() -> None:
    random = np.linspace(0.9, 0.5, 11)  # linear: Δb a triangle of area ½·1·0.4 = 0.2
    assert racu(RATIOS, np.full(11, 0.5), random) == pytest.approx(1.0)
    # the 0 % point is shared, so a method that drops to the 100 % score at 10 % loses the first
    # trapezoid: Δp = Δb except Δp_0 = 0, i.e. 0.2 − ½·0.1·0.4 = 0.18 → 0.9
    dropped = np.r_[0.9, np.full(10, 0.5)]
    assert racu(RATIOS, dropped, random) == pytest.approx(0.9)


def test_worse_than_random_is_negative_and_clipped() -> None:
    random = np.linspace(0.9, 0.5, 11)
    assert racu(RATIOS, random + 0.05 * (np.arange(11) % 2), random) < 0
    assert racu(RATIOS, np.r_[0.9, np.full(9, 5.0), 0.5], random) == -1.0


def test_flat_random_curve_has_no_racu() -> None:
    assert np.isnan(racu([0, 50, 100], [0.7, 0.6, 0.7], [0.7, 0.7, 0.7]))


@pytest.mark.parametrize(
    "ratios", [[10, 50, 100], [0, 50, 90], [0, 60, 50, 100], [0, 100, 100]],
)
def test_ratios_must_run_from_zero_to_hundred(ratios) -> None:
    with pytest.raises(AttnAuditError, match="RACU needs increasing masking ratios"):
        racu(ratios, [0.5] * len(ratios), [0.5] * len(ratios))


def test_one_score_per_ratio() -> None:
    with pytest.raises(AttnAuditError, match="one score per masking ratio"):
        racu([0, 50, 100], [0.5, 0.4], [0.6, 0.5, 0.4])


scores = st.floats(0.0, 1.0, allow_nan=False)


@st.composite
def curve_pairs(draw):
    n = draw(st.integers(2, 12))
    inner = sorted(draw(st.sets(st.integers(1, 99), min_size=n - 2, max_size=n - 2)))
    ratios = [0, *inner, 100]
    random = draw(st.lists(scores, min_size=len(ratios), max_size=len(ratios)))
    method = draw(st.lists(scores, min_size=len(ratios), max_size=len(ratios)))
    method[0] = random[0]  # the shared 0 % model
    return ratios, np.array(method), np.array(random)


@settings(max_examples=200, deadline=None)
@given(curve_pairs())
def test_against_plain_reimplementation(case) -> None:
    ratios, method, random = case
    most = integrate.trapezoid(random - random[-1], np.asarray(ratios) / 100)
    if abs(most) < 1e-9:
        return
    assert racu(ratios, method, random) == pytest.approx(plain_racu(ratios, method, random), abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(curve_pairs(), st.floats(0.01, 100), st.floats(-10, 10))
def test_invariant_to_scale_and_shift_of_the_score(case, scale, shift) -> None:
    ratios, method, random = case
    most = integrate.trapezoid(random - random[-1], np.asarray(ratios) / 100)
    if abs(most) < 1e-6:
        return
    before = racu(ratios, method, random)
    after = racu(ratios, scale * method + shift, scale * random + shift)
    assert after == pytest.approx(before, abs=1e-6)


@settings(max_examples=200, deadline=None)
@given(curve_pairs())
def test_sign_follows_which_curve_is_lower(case) -> None:
    ratios, method, random = case
    random = np.maximum(random, random[-1])  # a random curve above its 100 % value: positive denominator
    if integrate.trapezoid(random - random[-1], np.asarray(ratios) / 100) < 1e-6:
        return
    lower = np.minimum(method, random)
    higher = np.maximum(method, random)
    assert racu(ratios, lower, random) >= 0
    assert racu(ratios, higher, random) <= 0


def test_interval_is_scipys_seeded_bca_bootstrap_of_the_mean() -> None:
    values = [0.12, 0.18, 0.15, 0.2, 0.11]
    out = mean_interval(values, seed=3)
    ref = stats.bootstrap((np.array(values),), np.mean, confidence_level=0.95, random_state=np.random.default_rng(3))
    assert out["mean"] == pytest.approx(np.mean(values))
    assert (out["low"], out["high"]) == pytest.approx((ref.confidence_interval.low, ref.confidence_interval.high))
    assert out["low"] <= out["mean"] <= out["high"] and out["n"] == 5
    assert mean_interval(values, seed=3) == out  # seeded: the same interval again


def test_interval_conventions() -> None:
    assert mean_interval([0.3, 0.3, 0.3]) == {"mean": pytest.approx(0.3), "low": pytest.approx(0.3), "high": pytest.approx(0.3), "n": 3}
    one = mean_interval([0.4, float("nan")])
    assert one["mean"] == 0.4 and one["n"] == 1 and np.isnan(one["low"]) and np.isnan(one["high"])
    assert mean_interval([])["n"] == 0
