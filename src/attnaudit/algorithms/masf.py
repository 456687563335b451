"""MaSF: is an input in distribution? (Madsen et al. 2024, "Faithfulness measurable masked language models",
after Bhattacharya et al.'s Simes–Fisher test; the authors' ``ecoroar/ood/masf_slow.py`` is the reference read.)

A non-parametric test in three levels over the per-layer, max-pooled hidden states ``(N, L, D)`` of a reference
set (the masked validation set), fitted once:

1. per layer and dimension, the empirical CDF of the reference values gives each value a two-sided p-value
   ``min(F(x), 1 − F(x))`` (``F(x)``: the share of reference values strictly below ``x``);
2. per layer, the Simes statistic over the ``D`` dimensions, ``min_i p_(i) · D / i``, gets its two-sided p-value
   from the reference's own Simes statistics;
3. over the ``L`` layers, Fisher's statistic ``−2 Σ log(p + ε)`` gets a right-sided p-value ``1 − F(x)`` from the
   reference's Fisher statistics.

A small final p-value says the input's hidden states are unlike the reference's: out of distribution.
Written here (numpy, ~40 lines) rather than imported: no maintained package implements this three-level test.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EPSILON = 1e-8
"""Added to a p-value before its logarithm in Fisher's statistic (log 0), as the authors do."""


def empirical_cdf(reference: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per column, the share of ``reference`` values ``(N, ...)`` strictly below each of ``values`` ``(M, ...)``."""
    ordered = np.sort(reference, axis=0).reshape(reference.shape[0], -1)
    flat = values.reshape(values.shape[0], -1)
    below = np.empty(flat.shape, dtype=np.int64)
    for column in range(flat.shape[1]):
        below[:, column] = np.searchsorted(ordered[:, column], flat[:, column], side="left")
    return (below / reference.shape[0]).reshape(values.shape)


def two_sided(cdf: np.ndarray) -> np.ndarray:
    """A CDF value as a two-sided p-value: ``min(F, 1 − F)``."""
    return np.minimum(cdf, 1.0 - cdf)


def simes(p_values: np.ndarray) -> np.ndarray:
    """Simes' statistic over the last axis: ``min_i p_(i) · m / i`` (``p_(i)`` ascending, ``m`` p-values)."""
    m = p_values.shape[-1]
    return (np.sort(p_values, axis=-1) * (m / np.arange(1, m + 1))).min(axis=-1)


def fisher(p_values: np.ndarray) -> np.ndarray:
    """Fisher's statistic over the last axis: ``−2 Σ log(p + ε)``."""
    return -2.0 * np.log(p_values + EPSILON).sum(axis=-1)


@dataclass
class MaSF:
    """The three fitted reference distributions; :meth:`p_values` tests new inputs."""

    states: np.ndarray
    """Level 1: the reference's max-pooled hidden states ``(N, L, D)``."""
    layers: np.ndarray
    """Level 2: the reference's Simes statistics ``(N, L)``."""
    combined: np.ndarray
    """Level 3: the reference's Fisher statistics ``(N,)``."""

    @classmethod
    def fit(cls, states: np.ndarray) -> MaSF:
        """Fit on the reference's max-pooled hidden states ``(N, L, D)`` (each level's statistics of the reference
        itself, in sample, are the next level's reference)."""
        states = np.asarray(states, dtype=np.float64)
        if states.ndim != 3 or states.shape[0] < 2:
            raise ValueError(f"MaSF fits (N >= 2, layers, dimensions) states, got shape {states.shape}")
        layers = simes(two_sided(empirical_cdf(states, states)))
        combined = fisher(two_sided(empirical_cdf(layers, layers)))
        return cls(states, layers, combined)

    def p_values(self, states: np.ndarray) -> np.ndarray:
        """Right-sided p-values ``(M,)`` that each input (its max-pooled hidden states ``(M, L, D)``) is in distribution."""
        states = np.asarray(states, dtype=np.float64)
        if states.shape[1:] != self.states.shape[1:]:
            raise ValueError(f"states of shape {states.shape[1:]} per input, the reference's are {self.states.shape[1:]}")
        layers = simes(two_sided(empirical_cdf(self.states, states)))
        combined = fisher(two_sided(empirical_cdf(self.layers, layers)))
        return 1.0 - empirical_cdf(self.combined[:, None], combined[:, None])[:, 0]
