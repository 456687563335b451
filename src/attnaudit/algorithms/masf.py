"""MaSF: is an input in distribution? (Madsen et al. 2024, "Faithfulness measurable masked language models",
after Bhattacharya et al.'s Simes–Fisher test; the authors' ``ecoroar/ood/masf_slow.py`` is the reference read.)

A non-parametric test in three levels over the per-layer, max-pooled hidden states ``(N, L, D)`` of a reference
set (the masked validation set), fitted once:

1. per layer and dimension, the reference values give each value a two-sided p-value (the rarer tail);
2. per layer, the Simes statistic over the ``D`` dimensions, ``min_i p_(i) · D / i``, gets its two-sided p-value
   from the reference's own Simes statistics;
3. over the ``L`` layers, Fisher's statistic ``−2 Σ log(p + ε)`` gets a right-sided p-value from the
   reference's Fisher statistics.

A small final p-value says the input's hidden states are unlike the reference's: out of distribution.
Written here (numpy, ~40 lines) rather than imported: no maintained package implements this three-level test.

Two deliberate differences from the authors' code, both for small reference sets (an audit's few hundred
validation inputs), where theirs cannot reject or rejects too often; the two agree as N grows:

* p-values are conformal, ``(count + 1) / (N + 1)`` with the count of reference values at least as extreme
  (each tail), not the raw empirical CDF, under which a reference point that is a column's minimum has p = 0;
* each level is calibrated on its own part of the reference (split in three, seeded): level 1's values, level 2's
  Simes statistics of the second part, level 3's Fisher statistics of the third. The authors reuse one set in
  sample at every level; its Simes values then tie on a grid a new input's do not reach, and 23 % of inputs
  drawn from the reference distribution itself fell below 0.05. Split so, the third part's Fisher statistics and
  a new input's are exchangeable, and the final p-value is valid: in distribution, P(p < α) ≤ α.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EPSILON = 1e-8
"""Added to a p-value before its logarithm in Fisher's statistic (log 0), as the authors do."""


def _tails(reference: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per column, how many ``reference`` values ``(N, ...)`` are ``<=`` and ``>=`` each of ``values`` ``(M, ...)``."""
    ordered = np.sort(reference, axis=0).reshape(reference.shape[0], -1)
    flat = values.reshape(values.shape[0], -1)
    low, high = np.empty(flat.shape, dtype=np.int64), np.empty(flat.shape, dtype=np.int64)
    for column in range(flat.shape[1]):
        low[:, column] = np.searchsorted(ordered[:, column], flat[:, column], side="right")
        high[:, column] = ordered.shape[0] - np.searchsorted(ordered[:, column], flat[:, column], side="left")
    return low.reshape(values.shape), high.reshape(values.shape)


def two_sided_p(reference: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Conformal two-sided p-values of ``values`` against ``reference``: ``(min(#≤, #≥) + 1) / (N + 1)``."""
    low, high = _tails(reference, values)
    return (np.minimum(low, high) + 1.0) / (reference.shape[0] + 1.0)


def right_p(reference: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Conformal right-sided p-values: ``(#≥ + 1) / (N + 1)``."""
    return (_tails(reference, values)[1] + 1.0) / (reference.shape[0] + 1.0)


def simes(p_values: np.ndarray) -> np.ndarray:
    """Simes' statistic over the last axis: ``min_i p_(i) · m / i`` (``p_(i)`` ascending, ``m`` p-values)."""
    m = p_values.shape[-1]
    return (np.sort(p_values, axis=-1) * (m / np.arange(1, m + 1))).min(axis=-1)


def fisher(p_values: np.ndarray) -> np.ndarray:
    """Fisher's statistic over the last axis: ``−2 Σ log(p + ε)``."""
    return -2.0 * np.log(p_values + EPSILON).sum(axis=-1)


@dataclass
class MaSF:
    """The three fitted reference distributions, each from its own part of the reference; :meth:`p_values` tests inputs."""

    states: np.ndarray
    """Level 1: the first part's max-pooled hidden states ``(N1, L, D)``."""
    layers: np.ndarray
    """Level 2: the second part's Simes statistics ``(N2, L)`` (its states tested against the first part)."""
    combined: np.ndarray
    """Level 3: the third part's Fisher statistics ``(N3,)`` (its states through levels 1 and 2)."""

    @classmethod
    def fit(cls, states: np.ndarray, seed: int = 0) -> MaSF:
        """Fit on the reference's max-pooled hidden states ``(N, L, D)``, ``N >= 6``, split in three at random (seeded)."""
        states = np.asarray(states, dtype=np.float64)
        if states.ndim != 3 or states.shape[0] < 6:
            raise ValueError(f"MaSF fits (N >= 6, layers, dimensions) states, got shape {states.shape}")
        order = np.random.default_rng(seed).permutation(states.shape[0])
        first, second, third = np.array_split(order, 3)
        level_one = states[first]
        layers = simes(two_sided_p(level_one, states[second]))
        fitted = cls(level_one, layers, np.empty(0))
        fitted.combined = fitted.statistics(states[third])
        return fitted

    def statistics(self, states: np.ndarray) -> np.ndarray:
        """Fisher statistics ``(M,)`` of inputs' max-pooled hidden states ``(M, L, D)`` through levels 1 and 2."""
        states = np.asarray(states, dtype=np.float64)
        if states.shape[1:] != self.states.shape[1:]:
            raise ValueError(f"states of shape {states.shape[1:]} per input, the reference's are {self.states.shape[1:]}")
        return fisher(two_sided_p(self.layers, simes(two_sided_p(self.states, states))))

    def p_values(self, states: np.ndarray) -> np.ndarray:
        """Right-sided p-values ``(M,)`` that each input (its max-pooled hidden states ``(M, L, D)``) is in distribution."""
        return right_p(self.combined[:, None], self.statistics(states)[:, None])[:, 0]
