"""MaSF's three levels against hand computations, scipy and its defining properties."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from attnaudit.algorithms.masf import MaSF, fisher, right_p, simes, two_sided_p


def test_conformal_p_values_by_hand() -> None:
    reference = np.array([[1.0], [2.0], [2.0], [4.0]])  # N = 4: p = (count + 1) / 5
    values = np.array([[0.0], [2.0], [3.0], [9.0]])
    # <= counts 0, 3, 3, 4 and >= counts 4, 3, 1, 0: the rarer tail
    assert two_sided_p(reference, values)[:, 0].tolist() == pytest.approx([0.2, 0.8, 0.4, 0.2])
    assert right_p(reference, values)[:, 0].tolist() == pytest.approx([1.0, 0.8, 0.4, 0.2])


@given(arrays(np.float64, st.tuples(st.integers(2, 30), st.just(1)), elements=st.floats(-5, 5)), st.floats(-6, 6))
def test_conformal_p_values_count_as_scipy_does(reference: np.ndarray, value: float) -> None:
    n = len(reference)
    weak = scipy.stats.percentileofscore(reference[:, 0], value, kind="weak") / 100 * n  # how many <= value
    strict = scipy.stats.percentileofscore(reference[:, 0], value, kind="strict") / 100 * n  # how many < value
    expected = (min(weak, n - strict) + 1) / (n + 1)
    assert two_sided_p(reference, np.array([[value]]))[0, 0] == pytest.approx(expected)


def test_simes_and_fisher_by_hand() -> None:
    p = np.array([0.04, 0.01, 0.5])  # sorted 0.01, 0.04, 0.5 times 3/1, 3/2, 3/3 -> 0.03, 0.06, 0.5
    assert simes(p) == pytest.approx(0.03)
    assert fisher(np.array([0.5, 0.25])) == pytest.approx(-2 * (np.log(0.5 + 1e-8) + np.log(0.25 + 1e-8)))


@given(arrays(np.float64, st.integers(1, 12), elements=st.floats(1e-3, 1)))  # ε = 1e-8 moves log p by < 1e-5 there
def test_fisher_statistic_is_scipys_combine_pvalues(p: np.ndarray) -> None:
    statistic, _ = scipy.stats.combine_pvalues(p, method="fisher")
    assert fisher(p) == pytest.approx(statistic, rel=1e-4, abs=1e-6)


@pytest.mark.parametrize(("n", "d"), [(400, 16), (60, 32)])
def test_shifted_inputs_are_out_of_distribution_and_reference_like_ones_are_not(n: int, d: int) -> None:
    """Also with a small reference (60 inputs, 32 dimensions), where the raw empirical CDF could reject nothing."""
    rng = np.random.default_rng(0)
    test = MaSF.fit(rng.normal(size=(n, 3, d)))
    same = test.p_values(rng.normal(size=(400, 3, d)))
    shifted = test.p_values(rng.normal(loc=3.0, size=(200, 3, d)))
    assert (same < 0.05).mean() < 0.1  # about the level or below: in distribution
    assert (shifted < 0.05).mean() > 0.95


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**16), st.floats(0.1, 10))
def test_p_values_are_invariant_to_a_monotone_map_of_every_state(seed: int, scale: float) -> None:
    """Ranks are all MaSF reads: the same increasing map of reference and inputs changes no p-value."""
    rng = np.random.default_rng(seed)
    reference, inputs = rng.normal(size=(50, 2, 5)), rng.normal(size=(10, 2, 5))
    fitted, mapped = MaSF.fit(reference, seed=seed), MaSF.fit(np.exp(scale * reference), seed=seed)
    np.testing.assert_allclose(fitted.p_values(inputs), mapped.p_values(np.exp(scale * inputs)))


def test_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match="MaSF fits"):
        MaSF.fit(np.zeros((5, 2, 3)))
    with pytest.raises(ValueError, match="per input"):
        MaSF.fit(np.zeros((6, 2, 3))).p_values(np.zeros((2, 2, 4)))


def test_each_level_is_calibrated_on_its_own_part_and_p_values_are_valid() -> None:
    """In distribution, the share of p-values below α is at most about α (here over many inputs and α)."""
    rng = np.random.default_rng(1)
    test = MaSF.fit(rng.normal(size=(300, 2, 8)), seed=3)
    assert (len(test.states), len(test.layers), len(test.combined)) == (100, 100, 100)
    p = test.p_values(rng.normal(size=(3000, 2, 8)))
    for alpha in (0.05, 0.1, 0.25, 0.5):
        assert (p < alpha).mean() <= alpha + 0.02
