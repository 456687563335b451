"""RACU: the relative area between a ROAR curve and the random baseline's (Madsen et al. 2022).

A ROAR curve is a retrained model's test score against the share of each instance's items masked
(0 … 100 %). An importance measure that ranks the tokens the task needs first makes the score fall
faster than random masking does. Madsen, Meade, Adlakha & Reddy (2022, "Evaluating the faithfulness
of importance measures in NLP by recursively masking allegedly important tokens and retraining")
summarise it per seed as

    RACU = Σ_i ½ Δx_i (Δp_i + Δp_{i+1}) / Σ_i ½ Δx_i (Δb_i + Δb_{i+1}),
    Δp = random curve − method curve,   Δb = random curve − random curve at 100 %,

trapezoid areas over the masking ratios ``x`` as fractions, clipped to [−1, 1] as their
``export/roar_plot.py`` (``area_between``) does: 1 when the method's curve drops at once to the
score with everything masked, 0 when it is random masking, negative when it is worse than random.
Over seeds the mean is reported with a 95 % bootstrap interval, :func:`scipy.stats.bootstrap` of
the mean (BCa, its default, as theirs; seeded), the interval collapsing to the mean when every
seed gives the same value (their convention).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

from attnaudit.errors import AttnAuditError


def _curves(ratios: ArrayLike, *curves: ArrayLike) -> tuple[np.ndarray, ...]:
    """The ratios as fractions and the curves as float arrays, checked: 0 … 100 %, increasing, one value each."""
    x = np.asarray(ratios, dtype=float)
    if x.ndim != 1 or len(x) < 2 or x[0] != 0 or x[-1] != 100 or np.any(np.diff(x) <= 0):
        raise AttnAuditError(f"RACU needs increasing masking ratios from 0 to 100 %, got {x.tolist()}")
    ys = tuple(np.asarray(c, dtype=float) for c in curves)
    if any(y.shape != x.shape for y in ys):
        raise AttnAuditError(f"RACU needs one score per masking ratio ({len(x)}), got {[y.shape for y in ys]}")
    return (x / 100, *ys)


def trapezoid_area(x: np.ndarray, y: np.ndarray) -> float:
    """``Σ_i ½ Δx_i (y_i + y_{i+1})``: the trapezoid area under ``y`` over ``x``."""
    return float(np.sum((y[1:] + y[:-1]) * 0.5 * np.diff(x)))


def racu_areas(ratios: ArrayLike, method: ArrayLike, random: ArrayLike) -> tuple[float, float]:
    """``(area between random and method, area between random and random at 100 %)``: RACU's
    numerator and denominator, ``ratios`` in percent from 0 to 100."""
    x, y_method, y_random = _curves(ratios, method, random)
    return trapezoid_area(x, y_random - y_method), trapezoid_area(x, y_random - y_random[-1])


def racu(ratios: ArrayLike, method: ArrayLike, random: ArrayLike) -> float:
    """RACU of one seed's curves (module docstring), in [−1, 1]; NaN when the random curve encloses
    no area with its 100 % value (masking does not change the score: nothing to compare against)."""
    total, most = racu_areas(ratios, method, random)
    if most == 0 or not np.isfinite(most):
        return float("nan")
    return float(np.clip(total / most, -1.0, 1.0))


def mean_interval(values: Sequence[float] | np.ndarray, seed: int = 0, level: float = 0.95) -> dict[str, float]:
    """``mean``, ``low``, ``high`` (a ``level`` bootstrap interval of the mean: :func:`scipy.stats.bootstrap`,
    BCa, 9,999 resamples drawn from ``numpy.random.default_rng(seed)``) and ``n`` over the finite
    ``values`` (one per seed). Every value the same: the interval is the mean (Madsen et al.'s
    convention); one value or none: no interval (NaN)."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {"mean": float("nan"), "low": float("nan"), "high": float("nan"), "n": 0}
    mean = float(x.mean())
    if x.size == 1:
        low = high = float("nan")
    elif np.all(x == x[0]):
        low = high = mean
    else:
        with warnings.catch_warnings():  # few seeds: BCa may warn of a degenerate jackknife; NaN then says so
            warnings.simplefilter("ignore")
            res = stats.bootstrap((x,), np.mean, confidence_level=level, random_state=np.random.default_rng(seed))
        low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return {"mean": mean, "low": low, "high": high, "n": int(x.size)}
