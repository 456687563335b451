"""MaSF's three levels against hand computations, scipy and its defining properties."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from attnaudit.algorithms.masf import MaSF, empirical_cdf, fisher, simes, two_sided


def test_empirical_cdf_counts_reference_values_strictly_below() -> None:
    reference = np.array([[1.0], [2.0], [2.0], [4.0]])
    assert empirical_cdf(reference, np.array([[0.0], [2.0], [3.0], [5.0]]))[:, 0].tolist() == [0.0, 0.25, 0.75, 1.0]


@given(arrays(np.float64, st.tuples(st.integers(2, 30), st.integers(1, 4)), elements=st.floats(-5, 5)),
       arrays(np.float64, st.tuples(st.integers(1, 10), st.just(1)), elements=st.floats(-6, 6)))
def test_empirical_cdf_is_scipys_percentile_of_score_strict(reference: np.ndarray, values: np.ndarray) -> None:
    got = empirical_cdf(reference, np.repeat(values, reference.shape[1], axis=1))
    for column in range(reference.shape[1]):
        expected = [scipy.stats.percentileofscore(reference[:, column], v, kind="strict") / 100 for v in values[:, 0]]
        np.testing.assert_allclose(got[:, column], expected, atol=1e-12)


def test_simes_and_fisher_by_hand() -> None:
    p = np.array([0.04, 0.01, 0.5])  # sorted 0.01, 0.04, 0.5 times 3/1, 3/2, 3/3 -> 0.03, 0.06, 0.5
    assert simes(p) == pytest.approx(0.03)
    assert fisher(np.array([0.5, 0.25])) == pytest.approx(-2 * (np.log(0.5 + 1e-8) + np.log(0.25 + 1e-8)))
    assert two_sided(np.array([0.1, 0.5, 0.9])).tolist() == pytest.approx([0.1, 0.5, 0.1])


@given(arrays(np.float64, st.integers(1, 12), elements=st.floats(1e-3, 1)))  # ε = 1e-8 moves log p by < 1e-5 there
def test_fisher_statistic_is_scipys_combine_pvalues(p: np.ndarray) -> None:
    statistic, _ = scipy.stats.combine_pvalues(p, method="fisher")
    assert fisher(p) == pytest.approx(statistic, rel=1e-4)


def test_shifted_inputs_are_out_of_distribution_and_reference_like_ones_are_not() -> None:
    rng = np.random.default_rng(0)
    test = MaSF.fit(rng.normal(size=(400, 3, 16)))
    same = test.p_values(rng.normal(size=(200, 3, 16)))
    shifted = test.p_values(rng.normal(loc=3.0, size=(200, 3, 16)))
    assert 0.02 < (same < 0.05).mean() < 0.1  # about the level: in distribution
    assert (shifted < 0.05).mean() > 0.95


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**16), st.floats(0.1, 10))
def test_p_values_are_invariant_to_a_monotone_map_of_every_state(seed: int, scale: float) -> None:
    """Ranks are all MaSF reads: the same increasing map of reference and inputs changes no p-value."""
    rng = np.random.default_rng(seed)
    reference, inputs = rng.normal(size=(50, 2, 5)), rng.normal(size=(10, 2, 5))
    fitted, mapped = MaSF.fit(reference), MaSF.fit(np.exp(scale * reference))
    np.testing.assert_allclose(fitted.p_values(inputs), mapped.p_values(np.exp(scale * inputs)))


def test_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match="MaSF fits"):
        MaSF.fit(np.zeros((1, 2, 3)))
    with pytest.raises(ValueError, match="per input"):
        MaSF.fit(np.zeros((4, 2, 3))).p_values(np.zeros((2, 2, 4)))
