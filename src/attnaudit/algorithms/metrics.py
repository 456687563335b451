"""Metrics shared by every experiment: divergences, rank correlations, task scores.

Divergences are torch functions batched over leading dimensions and safe on sparse
distributions (exact zeros from sparsemax/entmax): ``0 · log 0 = 0``, never NaN.
Rank correlations wrap :mod:`scipy.stats`; task scores wrap sklearn, seqeval and
sacrebleu.  Conventions for degenerate input (constant vectors, a single class, an
empty corpus) are NaN, stated per function, so averages can use ``nanmean``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Hashable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np
import sacrebleu
import torch
from numpy.typing import ArrayLike
from scipy import stats
from sklearn import metrics as sk_metrics
from sklearn.metrics import average_precision_score, roc_auc_score
from torch import Tensor

LN2 = math.log(2.0)

Labels = Sequence[Any] | np.ndarray
"""One label per instance, as a list or a 1-d array (what the classification scores take)."""


def _float(x: Tensor) -> Tensor:
    """Integer/bool inputs become the default float dtype; float dtypes are kept."""
    return x if x.is_floating_point() else x.to(torch.get_default_dtype())


def tvd(p: Tensor, q: Tensor, dim: int = -1) -> Tensor:
    """Total variation distance ``½‖p − q‖₁`` along ``dim``; in [0, 1] for distributions."""
    p, q = _float(p), _float(q)
    return 0.5 * (p - q).abs().sum(dim)


def kl(p: Tensor, q: Tensor, dim: int = -1, eps: float = 1e-10) -> Tensor:
    """``KL(p ‖ q)`` in nats along ``dim``.

    ``q`` is smoothed to ``(q + eps) / (1 + n·eps)`` (``n`` = size of ``dim``) so that a
    zero in ``q`` where ``p > 0`` (routine with sparsemax) gives a large finite value
    instead of ``inf``; the renormalisation keeps ``q`` a distribution, so Gibbs'
    inequality still holds.  Terms with ``p = 0`` contribute exactly 0.  The result is
    clamped at 0 to remove ``-1e-17``-sized rounding noise when ``p ≈ q``.
    """
    p, q = _float(p), _float(q)
    n = q.shape[dim]
    q_smooth = (q + eps) / (1.0 + n * eps)
    return (torch.xlogy(p, p) - torch.xlogy(p, q_smooth)).sum(dim).clamp_min(0.0)


def jsd(p: Tensor, q: Tensor, dim: int = -1) -> Tensor:
    """Jensen–Shannon divergence in nats along ``dim``; in [0, ln 2].

    Not the square-rooted distance that :func:`scipy.spatial.distance.jensenshannon`
    returns.  No smoothing is needed: the mixture ``m`` is positive wherever ``p`` or
    ``q`` is, and ``xlogy`` makes zero-probability terms exactly 0.
    """
    p, q = _float(p), _float(q)
    m = 0.5 * (p + q)
    kl_pm = (torch.xlogy(p, p) - torch.xlogy(p, m)).sum(dim)
    kl_qm = (torch.xlogy(q, q) - torch.xlogy(q, m)).sum(dim)
    return (0.5 * (kl_pm + kl_qm)).clamp(0.0, LN2)


def output_change(p: Tensor, q: Tensor) -> Tensor:
    """Per-instance change of the prediction, Jain & Wallace's convention.

    ``p``, ``q``: ``(B, C)`` class probabilities, or ``(B,)`` positive-class
    probabilities of a binary model with one sigmoid output.  Binary: ``|Δŷ|``, the
    absolute difference of positive-class probabilities; multi-class: TVD.  For
    ``C = 2`` the two coincide (``½(|Δp₀| + |Δp₁|) = |Δp₁|``), so one formula serves.
    """
    if p.shape != q.shape:
        raise ValueError(f"output_change: shapes differ: {tuple(p.shape)} vs {tuple(q.shape)}")
    p, q = _float(p), _float(q)
    if p.dim() == 1:
        return (p - q).abs()
    return tvd(p, q, dim=-1)


def _vectors(a: ArrayLike | Tensor, b: ArrayLike | Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Both inputs as flat float64 arrays of equal length."""
    x = np.asarray(a.detach().cpu() if isinstance(a, Tensor) else a, dtype=np.float64).ravel()
    y = np.asarray(b.detach().cpu() if isinstance(b, Tensor) else b, dtype=np.float64).ravel()
    if x.shape != y.shape:
        raise ValueError(f"rank correlation: lengths differ: {x.size} vs {y.size}")
    return x, y


def rank_items(scores: Tensor, removable: Tensor) -> Tensor:
    """Rank ``(B,K)`` of each item by decreasing score (0 = highest), ties by position; items
    that cannot be removed rank after all removable ones (ERASER's top-k sets, leave-one-out's top-K)."""
    filled = scores.detach().to(torch.float64).masked_fill(~removable, float("-inf"))
    order = torch.sort(filled, dim=-1, descending=True, stable=True).indices
    return torch.argsort(order, dim=-1)


def top_items(ranks: Tensor, removable: Tensor, k: Tensor) -> Tensor:
    """``(B,K)`` True at the ``k`` (per instance) highest-ranked removable items."""
    return (ranks < k[:, None]) & removable


def kendall_tau(a: ArrayLike | Tensor, b: ArrayLike | Tensor) -> tuple[float, float]:
    """Kendall's τ-b and its two-sided p-value (:func:`scipy.stats.kendalltau`).

    NaN-safe: a constant vector or fewer than two items gives ``(nan, nan)`` without a
    warning, so callers can aggregate with ``nanmean`` and count the NaNs.
    """
    x, y = _vectors(a, b)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = stats.kendalltau(x, y)
    return float(res.statistic), float(res.pvalue)


# Pairs (rows × n²) one block of :func:`kendall_tau_rows` may hold: 2**22 keeps it near 32 MB.
_PAIR_BLOCK = 1 << 22


def kendall_tau_rows(rows: ArrayLike | Tensor, b: ArrayLike | Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Kendall's τ-b and two-sided p-value of every row of ``rows`` ``(R, n)`` against ``b`` ``(n,)``.

    The numbers :func:`kendall_tau` gives row by row (scipy's ``method='auto'``: the exact null
    distribution without ties when ``n ≤ 33`` or at most one pair is discordant (or concordant),
    else the normal approximation with scipy's tie-corrected variance), computed for all rows at
    once from pair signs. Written here because scipy has no batched τ and the importance test
    compares hundreds of heads per instance: one scipy call each cost it more than its forward
    passes. NaN rows (NaN or constant input, fewer than two items) as in :func:`kendall_tau`.
    """
    x = np.atleast_2d(np.asarray(rows.detach().cpu() if isinstance(rows, Tensor) else rows, dtype=np.float64))
    y = np.asarray(b.detach().cpu() if isinstance(b, Tensor) else b, dtype=np.float64).ravel()
    if x.shape[1] != y.size:
        raise ValueError(f"rank correlation: lengths differ: {x.shape[1]} vs {y.size}")
    n = y.size
    tau = np.full(len(x), np.nan)
    pvalue = np.full(len(x), np.nan)
    if n < 2 or np.isnan(y).any():
        return tau, pvalue
    upper = np.triu(np.ones((n, n), dtype=bool), 1)
    sy = np.sign(y[:, None] - y[None, :])[upper]
    ytie, y0, y1 = _tie_terms(y[None, :])
    step = max(1, _PAIR_BLOCK // (n * n))
    for start in range(0, len(x), step):
        part = slice(start, start + step)
        tau[part], pvalue[part] = _tau_block(x[part], sy, upper, (ytie[0], y0[0], y1[0]))
    return tau, pvalue


def _tie_terms(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: tied pairs and scipy's two variance terms ``Σ t(t−1)(t−2)``, ``Σ t(t−1)(2t+5)`` over tie
    groups of size t, summed per element as ``f(t)/t`` (each element knows its group's size)."""
    group = (x[:, :, None] == x[:, None, :]).sum(-1).astype(np.float64)
    return (group - 1).sum(-1) / 2, ((group - 1) * (group - 2)).sum(-1), ((group - 1) * (2 * group + 5)).sum(-1)


def _tau_block(
    x: np.ndarray, sy: np.ndarray, upper: np.ndarray, y_ties: tuple[float, float, float]
) -> tuple[np.ndarray, np.ndarray]:
    """τ-b and p of the rows ``x`` against the pair signs ``sy`` of the other vector (see :func:`kendall_tau_rows`)."""
    n = x.shape[1]
    tot = n * (n - 1) // 2
    ytie, y0, y1 = y_ties
    sx = np.sign(x[:, :, None] - x[:, None, :])[:, upper]
    both = sx * sy
    con_minus_dis = both.sum(-1)
    dis = (both < 0).sum(-1)
    xtie, x0, x1 = _tie_terms(x)
    bad = np.isnan(x).any(-1) | (xtie == tot) | (ytie == tot)
    with np.errstate(invalid="ignore", divide="ignore"):
        tau = np.clip(con_minus_dis / np.sqrt(tot - xtie) / np.sqrt(tot - ytie), -1.0, 1.0)
        m = n * (n - 1.0)
        var = (m * (2 * n + 5) - x1 - y1) / 18 + 2 * xtie * ytie / m + (x0 * y0 / (9 * m * (n - 2)) if n > 2 else 0.0)
        pvalue = 2 * stats.norm.sf(np.abs(con_minus_dis) / np.sqrt(var))
    exact = (xtie == 0) & (ytie == 0) & ((n <= 33) | (np.minimum(dis, tot - dis) <= 1))
    if exact.any():
        fewest = np.minimum(dis[exact], tot - dis[exact])
        cdf = _inversions_cdf(n) if n <= 33 else np.array([1 / math.factorial(n), 1 / math.factorial(n - 1)])
        pvalue[exact] = np.minimum(1.0, 2 * cdf[fewest])
    tau[bad], pvalue[bad] = np.nan, np.nan
    return tau, np.clip(pvalue, 0.0, 1.0)


_CDF_CACHE: dict[int, np.ndarray] = {}


def _inversions_cdf(n: int) -> np.ndarray:
    """P(at most c discordant pairs) for c = 0..n(n−1)/2 under independence: the cumulative
    Mahonian numbers (permutations of n with c inversions) over n!, from exact integers."""
    if n not in _CDF_CACHE:
        counts = [1]
        for j in range(2, n + 1):  # inserting the j-th element adds 0..j-1 inversions: a window sum
            prefix = [0]
            for value in counts:
                prefix.append(prefix[-1] + value)
            size = len(counts) + j - 1
            counts = [prefix[min(c, len(counts) - 1) + 1] - prefix[max(0, c - j + 1)] for c in range(size)]
        total = math.factorial(n)
        running, cdf = 0, []
        for value in counts:
            running += value
            cdf.append(running / total)
        _CDF_CACHE[n] = np.asarray(cdf)
    return _CDF_CACHE[n]


def kendall_tau_topk(a: ArrayLike | Tensor, b: ArrayLike | Tensor, k: int) -> tuple[float, float]:
    """Kendall's τ-b restricted to the union of the top-``k`` items of ``a`` and of ``b``.

    Jain & Wallace's top-k variant: rank agreement between, e.g., attention and
    gradient importance only over the features either method ranks highly, so a long
    tail of near-zero scores does not dominate.  "Top" means largest values; ties at
    the cut-off go to the earlier index.  ``k ≥ len(a)`` is plain :func:`kendall_tau`.
    Same NaN convention as :func:`kendall_tau`.
    """
    if k < 1:
        raise ValueError(f"kendall_tau_topk: k must be >= 1, got {k}")
    x, y = _vectors(a, b)
    top = np.union1d(np.argsort(-x, kind="stable")[:k], np.argsort(-y, kind="stable")[:k])
    return kendall_tau(x[top], y[top])


def spearman(a: ArrayLike | Tensor, b: ArrayLike | Tensor) -> tuple[float, float]:
    """Spearman's ρ and its two-sided p-value (:func:`scipy.stats.spearmanr`).

    NaN-safe like :func:`kendall_tau`.
    """
    x, y = _vectors(a, b)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = stats.spearmanr(x, y)
    return float(res.statistic), float(res.pvalue)


def spearman_rows(a: ArrayLike | Tensor, b: ArrayLike | Tensor) -> np.ndarray:
    """Spearman's ρ of each row of ``a`` ``(R, n)`` with the matching row of ``b`` (or ``b`` ``(n,)`` for all).

    :func:`spearman`'s statistic (Pearson's r of average ranks, ties averaged as
    :func:`scipy.stats.rankdata` does) for many rows in one call: the rollout test compares every
    layer of every instance, and one scipy call per pair cost it more than its forward passes.
    NaN for a row with fewer than 3 items, a constant row or any NaN (the
    :func:`~attnaudit.experiments.common.measures.spearman_rho` convention)."""
    x = np.atleast_2d(np.asarray(a.detach().cpu() if isinstance(a, Tensor) else a, dtype=np.float64))
    y = np.broadcast_to(np.asarray(b.detach().cpu() if isinstance(b, Tensor) else b, dtype=np.float64), x.shape)
    out = np.full(len(x), np.nan)
    if x.shape[1] < 3:
        return out
    bad = np.isnan(x).any(1) | np.isnan(y).any(1) | (x == x[:, :1]).all(1) | (y == y[:, :1]).all(1)
    rx = stats.rankdata(x, axis=1)
    ry = stats.rankdata(y, axis=1)
    rx -= rx.mean(1, keepdims=True)
    ry -= ry.mean(1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = (rx * ry).sum(1) / np.sqrt((rx * rx).sum(1) * (ry * ry).sum(1))
    out[~bad] = np.clip(rho[~bad], -1.0, 1.0)
    return out


def entropy_rows(scores: ArrayLike | Tensor) -> np.ndarray:
    """Entropy of each row of non-negative ``scores`` ``(R, n)`` read as a distribution, over ``log n``
    (1 = even, 0 = all on one item); NaN with fewer than 2 items or a row without weight."""
    x = np.atleast_2d(np.asarray(scores.detach().cpu() if isinstance(scores, Tensor) else scores, dtype=np.float64))
    out = np.full(len(x), np.nan)
    total = x.sum(1)
    live = total > 0
    if x.shape[1] < 2 or not live.any():
        return out
    p = x[live] / total[live, None]
    out[live] = stats.entropy(p, axis=1) / math.log(x.shape[1])
    return out


def accuracy(y_true: Labels, y_pred: Labels) -> float:
    """Fraction of exact matches; NaN for empty input."""
    if len(y_true) == 0:
        return math.nan
    return float(sk_metrics.accuracy_score(y_true, y_pred))


def macro_f1(y_true: Labels, y_pred: Labels, labels: Sequence[Any] | None = None) -> float:
    """Unweighted mean of per-class F1 over ``labels`` (default: classes present).

    A class never predicted nor present scores 0 (sklearn ``zero_division=0``);
    NaN for empty input.
    """
    if len(y_true) == 0:
        return math.nan
    return float(
        sk_metrics.f1_score(y_true, y_pred, labels=labels, average="macro", zero_division=0)
    )


def roc_auc(y_true: ArrayLike, prob_pos: ArrayLike) -> float:
    """Binary ROC AUC of positive-class scores; NaN when only one class is present."""
    y = np.asarray(y_true)
    if np.unique(y).size < 2:
        return math.nan
    return float(sk_metrics.roc_auc_score(y, np.asarray(prob_pos, dtype=np.float64)))


def chunk_f1(gold: list[list[str]], pred: list[list[str]]) -> dict[str, float]:
    """Chunk precision/recall/F1 with seqeval (conlleval-compatible, IOB2 tags).

    A chunk counts only if its type and both boundaries match. Undefined ratios
    (no predicted or no gold chunks) are 0, as in conlleval.
    """
    from seqeval import (
        metrics as seqeval_metrics,  # here: only tagging tasks need seqeval
    )

    _check_tag_shapes(gold, pred)
    kw: dict[str, Any] = {"zero_division": 0}
    return {
        "precision": float(seqeval_metrics.precision_score(gold, pred, **kw)),
        "recall": float(seqeval_metrics.recall_score(gold, pred, **kw)),
        "f1": float(seqeval_metrics.f1_score(gold, pred, **kw)),
    }


def _check_tag_shapes(gold: list[list[str]], pred: list[list[str]]) -> None:
    if len(gold) != len(pred):
        raise ValueError(f"tagging: {len(gold)} gold sequences but {len(pred)} predicted")
    for n, (g, p) in enumerate(zip(gold, pred, strict=True)):
        if len(g) != len(p):
            raise ValueError(f"tagging: sequence {n} has {len(g)} gold tags but {len(p)} predicted")


def score_classification(
    y_true: Labels,
    y_pred: Labels,
    probs: ArrayLike | None,
    labels: Sequence[Any],
) -> dict[str, float]:
    """Accuracy, macro-F1 over ``labels``, ``n``, and ROC AUC when ``len(labels) == 2``.

    ``probs``: ``(n, C)`` class probabilities (column 1 is the positive class) or
    ``(n,)`` positive-class probabilities; ``None`` omits ROC AUC.
    """
    out = {
        "accuracy": accuracy(y_true, y_pred),
        "macro_f1": macro_f1(y_true, y_pred, labels=list(labels)),
        "n": len(y_true),
    }
    if len(labels) == 2 and probs is not None:
        p = np.asarray(probs, dtype=np.float64)
        out["roc_auc"] = roc_auc(y_true, p[:, 1] if p.ndim == 2 else p)
    return out


def score_tagging(gold: list[list[str]], pred: list[list[str]]) -> dict[str, float]:
    """Chunk precision/recall/F1, token accuracy, ``n`` sequences and ``n_tokens``."""
    from seqeval import metrics as seqeval_metrics

    out = chunk_f1(gold, pred)
    n_tokens = sum(len(g) for g in gold)
    out["token_accuracy"] = (
        float(seqeval_metrics.accuracy_score(gold, pred)) if n_tokens else math.nan
    )
    out["n"] = len(gold)
    out["n_tokens"] = n_tokens
    return out


def aer(
    predicted: AbstractSet[Hashable],
    sure: AbstractSet[Hashable],
    possible: AbstractSet[Hashable],
) -> float:
    """Alignment error rate (Och & Ney 2003): ``1 − (|A∩S| + |A∩P|) / (|A| + |S|)``.

    Links are ``(source, target)`` index pairs; for corpus-level AER pass
    ``(sentence, source, target)`` triples (any hashable link works).  Sure links are
    possible by definition, so ``P`` is taken as ``possible ∪ sure``.  When
    ``|A| + |S| = 0`` (nothing to align, nothing predicted) the prediction is perfect
    and AER is 0.
    """
    possible_all = set(possible) | set(sure)
    denom = len(predicted) + len(sure)
    if denom == 0:
        return 0.0
    hits = len(set(predicted) & set(sure)) + len(set(predicted) & possible_all)
    return 1.0 - hits / denom


def bleu(hypotheses: list[str], references: list[str]) -> float:
    """Corpus BLEU (0–100) with sacrebleu's defaults (13a tokenisation), one reference each.

    NaN for an empty corpus.
    """
    if len(hypotheses) != len(references):
        raise ValueError(
            f"bleu: {len(hypotheses)} hypotheses but {len(references)} references"
        )
    if not hypotheses:
        return math.nan
    return float(sacrebleu.corpus_bleu(hypotheses, [references]).score)


RATIONALE_METRICS = ("ap", "auc", "precision_at_k")


def precision_at_k(scores: np.ndarray, positive: np.ndarray, k: int) -> float:
    """Share of the ``k`` highest scores that are positive, ties at the cut-off shared out in expectation.

    Items tied with the k-th largest score fill the remaining places at random, so they
    contribute their positive fraction times the number of places left.
    """
    if k < 1 or scores.size == 0:
        return math.nan
    k = min(k, scores.size)
    cut = np.sort(scores)[::-1][k - 1]
    above = scores > cut
    tied = scores == cut
    places = k - int(above.sum())
    hits = float(positive[above].sum()) + places * float(positive[tied].mean())
    return hits / k


def random_average_precision(n: int, r: int) -> float:
    """Expected AP of a uniformly random ranking of ``n`` units with ``r`` positives.

    A positive at rank ``t`` has on average ``(t-1)(r-1)/(n-1)`` positives above it, so
    ``E[AP] = (1/n) Σ_t (1 + (t-1)(r-1)/(n-1)) / t = (r-1)/(n-1) + H_n (n-r) / (n(n-1))``.
    """
    if r < 1 or n < 1:
        return math.nan
    if n == 1:
        return 1.0
    harmonic = float(np.sum(1.0 / np.arange(1, n + 1)))
    return (r - 1) / (n - 1) + harmonic * (n - r) / (n * (n - 1))


def score_against(scores: np.ndarray, positive: np.ndarray) -> dict[str, float]:
    """AP, ROC-AUC and precision@|rationale| of ``scores`` against ``positive`` (NaN when undefined)."""
    r = int(positive.sum())
    if r == 0 or not np.isfinite(scores).all():
        return {m: math.nan for m in RATIONALE_METRICS}
    both = 0 < r < positive.size
    return {
        "ap": float(average_precision_score(positive, scores)),
        "auc": float(roc_auc_score(positive, scores)) if both else math.nan,
        "precision_at_k": precision_at_k(scores, positive, r),
    }


def row_mean(values: Tensor, query_rows: Tensor) -> Tensor:
    """Mean of ``values`` (..., H, Q) over heads and real query rows; ``query_rows`` (B,Q) leads."""
    rows = query_rows.view(query_rows.shape[0], *([1] * (values.dim() - 3)), 1, query_rows.shape[1])
    rows = rows.expand_as(values).to(values.dtype)
    return (values * rows).sum((-1, -2)) / rows.sum((-1, -2)).clamp_min(1.0)
