"""Means and comparisons several tests report: the largest weight per row, JSD per layer, weighted means, Spearman rho."""

from __future__ import annotations

import numpy as np
from torch import Tensor

from attnaudit.algorithms.metrics import jsd, row_mean, spearman
from attnaudit.models.interface import (
    AttentionTrace,
)


def max_attention(weights: Tensor, query_rows: Tensor) -> Tensor:
    """Per instance, the largest weight of each attention row, averaged over heads and real query rows.

    For single-query attention (the RNN family, HAN) this is just ``max α``, J&W's x-axis.
    """
    peak = weights.max(-1).values
    rows = query_rows[:, None, :].expand_as(peak).to(peak.dtype)
    return (peak * rows).sum((1, 2)) / rows.sum((1, 2)).clamp_min(1.0)


def layer_jsd(original: AttentionTrace, changed: AttentionTrace) -> list[Tensor]:
    """Per layer, the JSD between two traces' attention, mean over heads and real queries ``(B,)``."""
    out = []
    for a, b in zip(original.layers, changed.layers):
        qmask = a.query_mask if a.query_mask is not None else a.mask
        out.append(row_mean(jsd(a.weights, b.weights), qmask))
    return out


def weighted_mean(values: np.ndarray, weights: np.ndarray) -> float:
    """``Σ w·v / Σ w`` over finite values (token-level means from per-sentence means)."""
    keep = np.isfinite(values)
    total = float(weights[keep].sum())
    return float((values[keep] * weights[keep]).sum() / total) if total else float("nan")


def spearman_rho(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman ρ of two 1-D arrays; NaN with fewer than 3 pairs or a constant input."""
    if a.size < 3 or np.all(a == a[0]) or np.all(b == b[0]):
        return float("nan")
    return float(spearman(a, b)[0])
