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
from torch import Tensor

LN2 = math.log(2.0)


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


def accuracy(y_true: ArrayLike, y_pred: ArrayLike) -> float:
    """Fraction of exact matches; NaN for empty input."""
    if len(y_true) == 0:
        return math.nan
    return float(sk_metrics.accuracy_score(y_true, y_pred))


def macro_f1(y_true: ArrayLike, y_pred: ArrayLike, labels: Sequence[Any] | None = None) -> float:
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
    from seqeval import metrics as seqeval_metrics  # here: only tagging tasks need seqeval

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
    y_true: ArrayLike,
    y_pred: ArrayLike,
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
