"""Context attribution on arrays, no models: which sentence of a context an answer came from.

* :func:`ablation_masks` and :func:`surrogate_weights`: ContextCite (Cohen-Wang et al. 2024): the answer's
  log-probability measured on random sentence ablations (each sentence kept with probability 1/2, seeded) and a
  sparse linear model (Lasso) fit on the keep-masks; its weights score the sentences.
* :func:`top_heads`: the heads read for an AttnTrace-style score (Wang et al. 2025), picked without any label:
  the ``k`` (layer, head) pairs whose answer-token attention puts the most mass on the context.
* :func:`top1_hit`, :func:`recall_at_k` and :func:`rank_correlation`: a sentence ranking against ground truth
  (bAbI's supporting facts) and against the measured effect of removing each sentence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats


def ablation_masks(sentences: int, count: int, rng: np.random.Generator, keep: float = 0.5) -> np.ndarray:
    """``(count, sentences)`` bool: random ablations, each sentence kept with probability ``keep`` (ContextCite's 1/2)."""
    return rng.random((count, sentences)) < keep


def surrogate_weights(masks: np.ndarray, values: np.ndarray, alpha: float, seed: int = 0) -> np.ndarray:
    """The weights ``w`` of a Lasso fit ``values ≈ w · mask + b`` (sklearn, ``alpha`` its L1 penalty on the mean
    squared error): each sentence's estimated effect of being present on the answer's log-probability."""
    from sklearn.linear_model import Lasso

    x = np.asarray(masks, dtype=float)
    y = np.asarray(values, dtype=float)
    if x.shape[0] < 2 or np.ptp(y) == 0:
        return np.zeros(x.shape[1])
    model = Lasso(alpha=alpha, random_state=seed, max_iter=10_000)
    model.fit(x, y)
    return np.asarray(model.coef_, dtype=float)


def top_heads(mass: np.ndarray, k: int) -> np.ndarray:
    """``(k, 2)`` (layer, head) indices of the ``k`` largest entries of ``mass`` ``(L, H)`` (ties: the earlier head)."""
    flat = np.asarray(mass, dtype=float).ravel()
    order = np.argsort(-flat, kind="stable")[: max(1, min(k, flat.size))]
    return np.stack(np.unravel_index(order, mass.shape), axis=1)


def ranking(scores: Sequence[float] | np.ndarray) -> np.ndarray:
    """Sentence indices from the highest score down (ties: the earlier sentence first)."""
    return np.argsort(-np.asarray(scores, dtype=float), kind="stable")


def top1_hit(scores: Sequence[float] | np.ndarray, supporting: Sequence[int]) -> float:
    """1.0 when the highest-scored sentence is a supporting fact, else 0.0."""
    return float(int(ranking(scores)[0]) in set(supporting))


def recall_at_k(scores: Sequence[float] | np.ndarray, supporting: Sequence[int], k: int | None = None) -> float:
    """The share of the supporting facts among the ``k`` highest-scored sentences (``k`` None: as many as there are
    supporting facts, so that 1.0 means the method ranks exactly them first)."""
    wanted = set(supporting)
    k = len(wanted) if k is None else k
    return len(wanted & set(ranking(scores)[:k].tolist())) / len(wanted) if wanted else math.nan


def rank_correlation(scores: Sequence[float] | np.ndarray, effect: Sequence[float] | np.ndarray) -> float:
    """Spearman's ρ (scipy) of a method's sentence scores with the measured effect; NaN with fewer than 3 sentences
    or a constant side."""
    a, b = np.asarray(scores, dtype=float), np.asarray(effect, dtype=float)
    if a.size < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return math.nan
    return float(stats.spearmanr(a, b).statistic)
