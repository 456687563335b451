"""Metrics against scipy/sklearn/seqeval/sacrebleu, hand-computed cases and properties."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import sacrebleu
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial.distance import jensenshannon
from scipy.stats import entropy, kendalltau, spearmanr
from sklearn.metrics import f1_score, roc_auc_score

from attnaudit.algorithms import metrics as M

LN2 = math.log(2.0)

# ---------------------------------------------------------------- strategies


@st.composite
def distribution(draw: st.DrawFn, n: int, sparse: bool = True) -> np.ndarray:
    """A probability vector of length ``n``; with ``sparse`` some entries are exact zeros."""
    weight = st.one_of(st.just(0.0), st.floats(0.01, 1.0)) if sparse else st.floats(0.01, 1.0)
    w = np.array(draw(st.lists(weight, min_size=n, max_size=n)))
    if w.sum() == 0:
        w[draw(st.integers(0, n - 1))] = 1.0
    return w / w.sum()


@st.composite
def pair(draw: st.DrawFn, k: int = 2) -> list[torch.Tensor]:
    """``k`` distributions of a common length, possibly sparse."""
    n = draw(st.integers(1, 8))
    return [torch.tensor(draw(distribution(n))) for _ in range(k)]


@st.composite
def disjoint(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    """Two distributions whose supports do not overlap."""
    n = draw(st.integers(2, 8))
    split = draw(st.integers(1, n - 1))
    p = draw(distribution(split))
    q = draw(distribution(n - split))
    return (
        torch.tensor(np.concatenate([p, np.zeros(n - split)])),
        torch.tensor(np.concatenate([np.zeros(split), q])),
    )


# ---------------------------------------------------------------- divergences


@settings(max_examples=60, deadline=None)
@given(pair(3))
def test_tvd_is_a_metric_in_unit_interval(dists: list[torch.Tensor]) -> None:
    p, q, r = dists
    d = M.tvd(p, q).item()
    assert -1e-12 <= d <= 1 + 1e-12
    assert d == pytest.approx(M.tvd(q, p).item(), abs=1e-12)
    assert M.tvd(p, p).item() == 0.0
    assert M.tvd(p, r).item() <= d + M.tvd(q, r).item() + 1e-12


@settings(max_examples=60, deadline=None)
@given(pair(2))
def test_jsd_symmetric_bounded_zero_iff_equal(dists: list[torch.Tensor]) -> None:
    p, q = dists
    d = M.jsd(p, q).item()
    assert not math.isnan(d)
    assert 0.0 <= d <= LN2
    assert d == pytest.approx(M.jsd(q, p).item(), abs=1e-12)
    assert M.jsd(p, p).item() == pytest.approx(0.0, abs=1e-12)
    if M.tvd(p, q).item() > 1e-4:
        assert d > 0.0
    assert d == pytest.approx(jensenshannon(p.numpy(), q.numpy()) ** 2, abs=1e-9)


@settings(max_examples=30, deadline=None)
@given(disjoint())
def test_jsd_is_ln2_for_disjoint_supports(pq: tuple[torch.Tensor, torch.Tensor]) -> None:
    assert M.jsd(*pq).item() == pytest.approx(LN2, abs=1e-12)
    assert M.tvd(*pq).item() == pytest.approx(1.0, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(pair(2))
def test_kl_nonnegative_finite_with_zeros(dists: list[torch.Tensor]) -> None:
    p, q = dists
    d = M.kl(p, q).item()
    assert math.isfinite(d) and d >= 0.0
    assert M.kl(p, p).item() == pytest.approx(0.0, abs=1e-8)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 8).flatmap(lambda n: st.tuples(distribution(n), distribution(n, sparse=False))))
def test_kl_matches_scipy_entropy_when_q_has_full_support(pq: tuple[np.ndarray, np.ndarray]) -> None:
    p, q = pq
    assert M.kl(torch.tensor(p), torch.tensor(q)).item() == pytest.approx(
        entropy(p, q), rel=1e-6, abs=1e-8
    )


def test_kl_zero_in_q_gives_large_finite_value() -> None:
    p = torch.tensor([0.5, 0.5])
    q = torch.tensor([1.0, 0.0])
    d = M.kl(p, q, eps=1e-10).item()
    assert math.isfinite(d)
    assert d == pytest.approx(math.log(0.5) - 0.5 * math.log(1e-10), rel=1e-6)


def test_divergences_are_batched_over_leading_dims() -> None:
    g = torch.Generator().manual_seed(0)
    p = torch.rand(3, 4, 5, generator=g).softmax(-1)
    q = torch.rand(3, 4, 5, generator=g).softmax(-1)
    for fn in (M.tvd, M.kl, M.jsd):
        batched = fn(p, q)
        assert batched.shape == (3, 4)
        assert torch.allclose(batched[1, 2], fn(p[1, 2], q[1, 2]))
    # dim= selects the distribution axis
    assert torch.allclose(M.jsd(p.transpose(1, 2), q.transpose(1, 2), dim=1), M.jsd(p, q))


def test_float32_sparse_distribution_has_no_nan() -> None:
    p = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.5, 0.0]], dtype=torch.float32)
    q = torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.5, 0.0]], dtype=torch.float32)
    for fn in (M.tvd, M.kl, M.jsd):
        out = fn(p, q)
        assert out.dtype == torch.float32
        assert not out.isnan().any()
    assert M.jsd(p, q)[0].item() == pytest.approx(LN2, abs=1e-6)
    assert M.jsd(p, q)[1].item() == 0.0


def test_output_change_binary_and_multiclass() -> None:
    pos_a = torch.tensor([0.9, 0.2])
    pos_b = torch.tensor([0.6, 0.5])
    assert torch.allclose(M.output_change(pos_a, pos_b), torch.tensor([0.3, 0.3]))
    two_a = torch.stack([1 - pos_a, pos_a], -1)
    two_b = torch.stack([1 - pos_b, pos_b], -1)
    assert torch.allclose(M.output_change(two_a, two_b), torch.tensor([0.3, 0.3]))
    three_a = torch.tensor([[0.5, 0.3, 0.2]])
    three_b = torch.tensor([[0.2, 0.3, 0.5]])
    assert torch.allclose(M.output_change(three_a, three_b), torch.tensor([0.3]))
    with pytest.raises(ValueError, match="shapes differ"):
        M.output_change(three_a, two_a)


# ---------------------------------------------------------------- rank correlations


@settings(max_examples=40, deadline=None)
@given(
    st.integers(2, 12).flatmap(
        lambda n: st.tuples(
            st.lists(st.integers(0, 5), min_size=n, max_size=n),
            st.lists(st.floats(-1, 1), min_size=n, max_size=n),
        )
    )
)
def test_correlations_match_scipy(ab: tuple[list[int], list[float]]) -> None:
    a, b = ab
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref_k = kendalltau(a, b)
        ref_s = spearmanr(a, b)
    np.testing.assert_allclose(M.kendall_tau(a, b), (ref_k.statistic, ref_k.pvalue), equal_nan=True)
    np.testing.assert_allclose(M.spearman(a, b), (ref_s.statistic, ref_s.pvalue), equal_nan=True)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(2, 40).flatmap(
        lambda n: st.tuples(
            st.lists(st.lists(st.integers(0, 4) | st.floats(-1, 1), min_size=n, max_size=n), min_size=1, max_size=5),
            st.lists(st.integers(0, 3) | st.floats(-1, 1), min_size=n, max_size=n),
        )
    )
)
def test_rowwise_correlations_equal_scipy_row_by_row(rows_b: tuple[list[list[float]], list[float]]) -> None:
    """Batched τ-b (with the exact and the tie-corrected normal p-values) and Spearman ρ, row by row."""
    rows, b = rows_b
    taus, pvalues = M.kendall_tau_rows(rows, b)
    rhos = M.spearman_rows(rows, b)
    for row, tau, p, rho in zip(rows, taus, pvalues, rhos):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = kendalltau(row, b)
            ref_rho = spearmanr(row, b).statistic if len(b) >= 3 and len(set(row)) > 1 and len(set(b)) > 1 else math.nan
        np.testing.assert_allclose((tau, p), (ref.statistic, ref.pvalue), rtol=1e-9, atol=1e-12, equal_nan=True)
        np.testing.assert_allclose(rho, ref_rho, rtol=1e-9, atol=1e-12, equal_nan=True)


def test_rowwise_exact_p_values_for_long_near_perfect_orders() -> None:
    """n > 33 with at most one discordant pair: scipy's exact 2/n! and 2/(n−1)!."""
    b = np.arange(40.0)
    swapped = b.copy()
    swapped[[5, 6]] = swapped[[6, 5]]
    taus, pvalues = M.kendall_tau_rows(np.stack([b, swapped, -b, np.full(40, 3.0)]), b)
    for row, tau, p in zip([b, swapped, -b], taus, pvalues):
        ref = kendalltau(row, b)
        assert (tau, p) == pytest.approx((ref.statistic, ref.pvalue), rel=1e-12)
    assert math.isnan(taus[3]) and math.isnan(pvalues[3])
    assert all(math.isnan(v) for v in M.kendall_tau_rows([[1.0, 2.0]], [1.0, math.nan])[0])


def test_entropy_rows_is_normalised_scipy_entropy() -> None:
    scores = np.array([[1.0, 1.0, 1.0, 1.0], [4.0, 0.0, 0.0, 0.0], [1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 0.0]])
    out = M.entropy_rows(scores)
    assert out[:3] == pytest.approx([1.0, 0.0, entropy([1, 2, 3, 4]) / math.log(4)])
    assert math.isnan(out[3]) and math.isnan(M.entropy_rows([[5.0]])[0])


def test_constant_vectors_give_nan_without_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for fn in (M.kendall_tau, M.spearman):
            tau, p = fn([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])
            assert math.isnan(tau) and math.isnan(p)
        assert all(math.isnan(v) for v in M.kendall_tau([1.0], [2.0]))


def test_kendall_accepts_tensors_and_checks_length() -> None:
    assert M.kendall_tau(torch.tensor([1.0, 2.0, 3.0]), np.array([1, 2, 3]))[0] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="lengths differ"):
        M.kendall_tau([1, 2], [1, 2, 3])


def test_kendall_tau_topk_uses_union_of_top_items() -> None:
    a = [5.0, 4.0, 3.0, 2.0, 1.0]
    b = [1.0, 2.0, 3.5, 4.0, 5.0]
    # top-2 of a = {0, 1}, of b = {4, 3}; on {0, 1, 3, 4} the orders are reversed.
    assert M.kendall_tau_topk(a, b, 2)[0] == pytest.approx(-1.0)
    assert M.kendall_tau_topk(a, b, 10) == pytest.approx(M.kendall_tau(a, b))
    c = [0.9, 0.1, 0.8, 0.2, 0.0, 0.05]
    d = [0.5, 0.3, 0.9, 0.6, 0.0, 0.01]
    # top-1: {0} ∪ {2}, a discordant pair (c: 0.9 > 0.8, d: 0.5 < 0.9)
    assert M.kendall_tau_topk(c, d, 1)[0] == pytest.approx(-1.0)
    idx = [0, 2, 3]  # top-2 of c = {0, 2}, of d = {2, 3}
    assert M.kendall_tau_topk(c, d, 2)[0] == pytest.approx(
        kendalltau([c[i] for i in idx], [d[i] for i in idx]).statistic
    )
    with pytest.raises(ValueError, match="k must be"):
        M.kendall_tau_topk(a, b, 0)


# ---------------------------------------------------------------- classification


def test_classification_scores_against_sklearn_and_hand_values() -> None:
    y = [0, 0, 1, 1]
    prob = [0.1, 0.4, 0.35, 0.8]
    assert M.roc_auc(y, prob) == pytest.approx(0.75)
    assert M.roc_auc(y, prob) == pytest.approx(roc_auc_score(y, prob))
    assert math.isnan(M.roc_auc([1, 1, 1], [0.2, 0.3, 0.9]))
    pred = [0, 1, 1, 1]
    assert M.accuracy(y, pred) == pytest.approx(0.75)
    # F1(class 0) = 2/3, F1(class 1) = 0.8
    assert M.macro_f1(y, pred) == pytest.approx((2 / 3 + 0.8) / 2)
    assert M.macro_f1(y, pred) == pytest.approx(f1_score(y, pred, average="macro"))
    # a label never seen nor predicted counts as 0
    assert M.macro_f1(y, pred, labels=[0, 1, 2]) == pytest.approx((2 / 3 + 0.8) / 3)
    assert math.isnan(M.accuracy([], [])) and math.isnan(M.macro_f1([], []))


def test_score_classification_binary_and_multiclass() -> None:
    probs = np.array([[0.9, 0.1], [0.6, 0.4], [0.65, 0.35], [0.2, 0.8]])
    out = M.score_classification([0, 0, 1, 1], [0, 0, 0, 1], probs, labels=[0, 1])
    assert out == pytest.approx(
        {"accuracy": 0.75, "macro_f1": f1_score([0, 0, 1, 1], [0, 0, 0, 1], average="macro"),
         "roc_auc": 0.75, "n": 4.0}
    )
    assert M.score_classification([0, 0, 1, 1], [0, 0, 0, 1], probs[:, 1], [0, 1])["roc_auc"] == 0.75
    multi = M.score_classification([0, 1, 2], [0, 1, 1], np.eye(3), labels=[0, 1, 2])
    assert set(multi) == {"accuracy", "macro_f1", "n"}
    assert multi["accuracy"] == pytest.approx(2 / 3)


# ---------------------------------------------------------------- tagging


GOLD = [["B-NP", "I-NP", "O", "B-VP", "B-NP"], ["B-PP", "B-NP"]]
PRED = [["B-NP", "I-NP", "O", "B-VP", "I-VP"], ["B-PP", "O"]]


def test_chunk_f1_hand_computed() -> None:
    # gold chunks: NP[0:2] VP[3] NP[4] PP[0] NP[1] -> 5; predicted: NP[0:2] VP[3:5] PP[0] -> 3
    # correct: NP[0:2], PP[0] -> 2.  P = 2/3, R = 2/5, F = 2PR/(P+R) = 1/2.
    out = M.chunk_f1(GOLD, PRED)
    assert out == pytest.approx({"precision": 2 / 3, "recall": 2 / 5, "f1": 0.5})


def test_score_tagging_adds_token_accuracy_and_counts() -> None:
    out = M.score_tagging(GOLD, PRED)
    assert out["token_accuracy"] == pytest.approx(5 / 7)
    assert out["n"] == 2 and out["n_tokens"] == 7
    assert out["f1"] == pytest.approx(0.5)
    assert M.chunk_f1([["O"]], [["O"]]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}


def test_tagging_shape_mismatch_is_reported() -> None:
    with pytest.raises(ValueError, match="sequence 1 has 2 gold tags but 1"):
        M.chunk_f1(GOLD, [PRED[0], ["O"]])
    with pytest.raises(ValueError, match="2 gold sequences but 1"):
        M.score_tagging(GOLD, PRED[:1])


# ---------------------------------------------------------------- alignment and translation


def test_aer_hand_computed() -> None:
    predicted = {(0, 0), (1, 1), (2, 1)}
    sure = {(0, 0), (1, 2)}
    possible = {(1, 1)}  # P is taken as possible ∪ sure = {(0,0), (1,1), (1,2)}
    # |A∩S| = 1, |A∩P| = 2, |A| + |S| = 5 -> AER = 1 - 3/5
    assert M.aer(predicted, sure, possible) == pytest.approx(0.4)
    assert M.aer(sure, sure, set()) == 0.0
    assert M.aer(set(), sure, possible) == 1.0
    assert M.aer(set(), set(), {(0, 0)}) == 0.0
    # corpus level: (sentence, source, target) triples
    assert M.aer({(0, 0, 0), (1, 0, 0)}, {(0, 0, 0)}, {(1, 0, 0)}) == pytest.approx(1 - 3 / 3)


def test_bleu_matches_sacrebleu() -> None:
    hyps = ["the cat sat on the mat", "a dog barked at night loudly"]
    refs = ["the cat sat on the mat", "the dog barked loudly at night"]
    assert M.bleu(hyps, refs) == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert M.bleu(refs, refs) == pytest.approx(100.0)
    assert math.isnan(M.bleu([], []))
    with pytest.raises(ValueError, match="2 hypotheses but 1"):
        M.bleu(hyps, refs[:1])
