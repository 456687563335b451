"""ERASER metrics (attnaudit.experiments.eraser_metrics): hand-computed cases, scipy references, hypothesis properties,
and the batched perturbations against a slow one-example-at-a-time loop written here."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from attnaudit.data.types import Batch, Example
from attnaudit.experiments.eraser_metrics import (
    agreement,
    aopc,
    bootstrap_ci,
    comprehensiveness,
    filler,
    masked_batch,
    perturbation_probs,
    perturbed,
    perturbed_probs,
    predictions,
    rank_items,
    removable_items,
    sufficiency,
    token_f1,
    top_count,
    top_items,
    topk_overlap,
)
from attnaudit.explain import get_explanation
from attnaudit.models import ModelConfig, build_model

# --------------------------------------------------------------------------- hand-computed cases


def test_top_count_by_hand() -> None:
    n = torch.tensor([10, 30, 2, 3, 1, 0, 7])
    assert top_count(n, 1).tolist() == [1, 1, 1, 1, 0, 0, 1]  # at least one item (none when n < 2)
    assert top_count(n, 10).tolist() == [1, 3, 1, 1, 0, 0, 1]  # 10 % of 30 is 3, not 4 (0.1*30 = 3.0000000000000004)
    assert top_count(n, 20).tolist() == [2, 6, 1, 1, 0, 0, 2]  # ceil(1.4) = 2
    assert top_count(n, 50).tolist() == [5, 15, 1, 2, 0, 0, 4]
    assert top_count(n, 99).tolist() == [9, 29, 1, 2, 0, 0, 6]  # never the whole input


def test_top_items_rank_by_score_ties_by_position_and_skip_unremovable() -> None:
    scores = torch.tensor([[0.5, 0.9, 0.5, 0.1, 7.0], [1.0, 1.0, 1.0, 0.0, 0.0]])
    removable = torch.tensor([[True, True, True, True, False], [False, True, True, True, False]])
    ranks = rank_items(scores, removable)
    assert ranks[0].tolist()[:4] == [1, 0, 2, 3] and ranks[1].tolist()[1:4] == [0, 1, 2]
    top = top_items(ranks, removable, torch.tensor([2, 2]))
    assert top.tolist() == [[True, True, False, False, False], [False, True, True, False, False]]


def test_comprehensiveness_sufficiency_and_aopc_by_hand() -> None:
    full = 0.9
    comp = comprehensiveness(full, [0.8, 0.5, 0.3])
    suff = sufficiency(full, [0.4, 0.7, 0.95])
    np.testing.assert_allclose(comp, [0.1, 0.4, 0.6])
    np.testing.assert_allclose(suff, [0.5, 0.2, -0.05])
    assert aopc(comp) == pytest.approx((0.1 + 0.4 + 0.6) / 3)
    assert aopc(suff) == pytest.approx(0.65 / 3)


def test_token_f1_and_overlap_by_hand() -> None:
    selected = np.array([True, True, True, False, False])
    positive = np.array([False, True, True, True, True])
    assert token_f1(selected, positive) == pytest.approx(2 * (2 / 3) * (1 / 2) / (2 / 3 + 1 / 2))  # 4/7
    assert token_f1(np.zeros(5, bool), positive) == 0.0
    a, b = np.array([5.0, 4, 3, 2, 1]), np.array([1.0, 4, 3, 5, 0])
    assert topk_overlap(a, b, 2) == 0.5  # {0,1} vs {3,1}
    assert topk_overlap(a, b, 3) == pytest.approx(2 / 3)  # {0,1,2} vs {3,1,2}
    assert math.isnan(topk_overlap(a, b, 0))


def test_agreement_is_kendall_tau_and_symmetric() -> None:
    rng = np.random.default_rng(0)
    scores = {name: rng.normal(size=9) for name in ("a", "b", "c")}
    pairs = agreement(scores, 3)
    for x in scores:
        assert pairs[(x, x)] == (1.0, 1.0)
        for y in scores:
            assert pairs[(x, y)] == pairs[(y, x)]
            if x != y:
                assert pairs[(x, y)][0] == pytest.approx(stats.kendalltau(scores[x], scores[y]).statistic)
                assert pairs[(x, y)][1] == topk_overlap(scores[x], scores[y], 3)


def test_bootstrap_ci_seeded_and_close_to_a_numpy_percentile_bootstrap() -> None:
    values = np.random.default_rng(1).normal(0.3, 1.0, size=400)
    low, high = bootstrap_ci(values, seed=7, resamples=2000)
    assert (low, high) == bootstrap_ci(values, seed=7, resamples=2000)
    assert low < values.mean() < high
    rng = np.random.default_rng(123)
    means = values[rng.integers(0, values.size, (4000, values.size))].mean(1)
    ref_low, ref_high = np.percentile(means, [2.5, 97.5])
    assert low == pytest.approx(ref_low, abs=0.02) and high == pytest.approx(ref_high, abs=0.02)
    half = values.std() / math.sqrt(values.size) * 1.96  # the normal approximation's half-width
    assert (high - low) / 2 == pytest.approx(half, rel=0.1)
    assert bootstrap_ci([0.2, 0.2, 0.2], seed=0) == (0.2, 0.2)
    assert all(math.isnan(v) for v in bootstrap_ci([1.0, float("nan")], seed=0))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.floats(-1, 1), min_size=5, max_size=5), min_size=1, max_size=6))
def test_aopc_is_the_mean_over_bins(values: list[list[float]]) -> None:
    arr = np.array(values)
    np.testing.assert_allclose(aopc(arr), [sum(row) / len(row) for row in values], atol=1e-12)


# --------------------------------------------------------------------------- a tiny model and random batches


VOCAB = 12


def tiny_model(family: str) -> torch.nn.Module:
    torch.manual_seed(0)
    extra = {"d_model": 8, "heads": 2, "layers": 2, "d_ff": 16} if family == "transformer" else {}
    config = ModelConfig(model=family, task_type="classification", vocab_size=VOCAB, num_labels=3, embed_dim=8, hidden_dim=8, **extra)
    return build_model(config).double().eval()


def random_batch(lengths: list[int], seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    tokens = torch.randint(2, VOCAB, (len(lengths), width), generator=g).masked_fill(~mask, 0)
    return Batch(tokens=tokens, mask=mask)


batches = st.tuples(st.lists(st.integers(1, 9), min_size=1, max_size=5), st.integers(0, 2**16))


@settings(max_examples=25, deadline=None)
@given(batches, st.sampled_from(["bilstm", "transformer"]), st.sampled_from(["delete", "mask"]))
def test_removing_nothing_and_keeping_everything_change_nothing(shape: tuple[list[int], int], family: str, mode: str) -> None:
    """Comprehensiveness of an empty removal and sufficiency of keeping every item are 0."""
    batch = random_batch(*shape)
    model = tiny_model(family)
    pred, full = predictions(model, batch)
    rows = torch.arange(len(batch))
    probs = perturbed_probs(model, batch, rows, batch.mask.clone(), pred, mode)  # type: ignore[arg-type]
    np.testing.assert_allclose(comprehensiveness(full.numpy(), probs.numpy()), 0.0, atol=1e-12)
    np.testing.assert_allclose(sufficiency(full.numpy(), probs.numpy()), 0.0, atol=1e-12)


@settings(max_examples=50, deadline=None)
@given(batches, st.floats(0.5, 99.5), st.sampled_from(["delete", "mask"]))
def test_removal_never_touches_padding(shape: tuple[list[int], int], percent: float, mode: str) -> None:
    batch = random_batch(*shape)
    model = tiny_model("bilstm")
    scores = torch.rand(batch.mask.shape, generator=torch.Generator().manual_seed(shape[1]))
    removable = removable_items(model, batch)
    n = removable.sum(1)
    top = top_items(rank_items(scores, removable), removable, top_count(n, percent))
    assert not (top & ~batch.mask).any()
    keep = batch.mask & ~top
    out = perturbed(model, batch, torch.arange(len(batch)), keep, mode, 1)  # type: ignore[arg-type]
    if mode == "mask":
        assert torch.equal(out.mask, batch.mask)
        assert torch.equal(out.tokens[~batch.mask], batch.tokens[~batch.mask])  # padding unchanged
        assert torch.equal(out.tokens[keep], batch.tokens[keep]) and (out.tokens[top] == 1).all()
    else:
        assert out.mask.sum(1).tolist() == keep.sum(1).tolist()
        assert (out.tokens[~out.mask] == 0).all()
        for b in range(len(batch)):
            assert out.tokens[b][out.mask[b]].tolist() == batch.tokens[b][keep[b]].tolist()


def test_hf_special_tokens_are_never_removed(tiny_hf) -> None:  # type: ignore[no-untyped-def]
    from attnaudit.hf import load_hf

    run = load_hf(tiny_hf.dir, task=tiny_hf.task(), device="cpu")
    batch = run.collate(run.data().test[:4])
    removable = removable_items(run.model, batch)
    cls_sep = torch.isin(batch.tokens, torch.tensor([2, 3]))
    assert not (removable & cls_sep).any() and torch.equal(removable | cls_sep, batch.mask)
    assert filler(run.model) == (4, "[MASK]")
    out = masked_batch(batch, torch.arange(len(batch)), batch.mask & ~removable, batch.mask, 4)
    assert torch.equal(out.tokens[removable], torch.full_like(batch.tokens[removable], 4))
    assert torch.equal(out.tokens[~removable], batch.tokens[~removable])


# --------------------------------------------------------------------------- batched == slow reference


def slow_probs(run, example: Example, scores: list[float], percent: float, mode: str, unk: str) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """p(ŷ) without the top-k tokens and with only them, one example at a time from the token strings."""
    tokens = list(example.tokens)
    n = len(tokens)
    k = min(max(math.ceil(Fraction(n) * Fraction(percent).limit_denominator(10**6) / 100), 1), n - 1)
    top = set(sorted(range(n), key=lambda i: (-scores[i], i))[:k])

    def prob(kept: set[int]) -> float:
        if mode == "delete":
            words = [t for i, t in enumerate(tokens) if i in kept]
        else:
            words = [t if i in kept else unk for i, t in enumerate(tokens)]
        with torch.no_grad():
            return run.model(run.collate([Example(tokens=words, label=example.label)])).probs.double()[0]

    full = prob(set(range(n)))
    pred = int(full.argmax())
    return float(prob(set(range(n)) - top)[pred]), float(prob(top)[pred])


@pytest.mark.parametrize("name", ["bilstm", "transformer", "hf"])
@pytest.mark.parametrize("mode", ["delete", "mask"])
def test_batched_perturbations_equal_the_slow_loop(name: str, mode: str, tiny_attention_run, tiny_hf) -> None:  # type: ignore[no-untyped-def]
    if name == "hf":
        from attnaudit.hf import load_hf

        run = load_hf(tiny_hf.dir, task=tiny_hf.task(), device="cpu")
        examples, unk = run.data().test[:8], "[MASK]"
    else:
        run = tiny_attention_run(name)
        examples, unk = run.data().test[:12], "<unk>"
    run.model.double().eval()
    try:
        batch = run.collate(examples)
        methods = {m: get_explanation(m)(run.model, batch, seed=3) for m in ("attention", "random")}
        percents = [1.0, 10.0, 20.0, 50.0, 90.0]
        removed, kept = perturbation_probs(run.model, batch, methods, percents, mode)  # type: ignore[arg-type]
        removable = removable_items(run.model, batch)
        for j, scores in enumerate(methods.values()):
            for b, example in enumerate(examples):
                word_scores = scores[b][removable[b]].tolist()
                assert len(word_scores) == len(example.tokens)
                if len(word_scores) < 2:  # nothing to remove short of everything: left out
                    assert removed[j, :, b].isnan().all() and kept[j, :, b].isnan().all()
                    continue
                for f, percent in enumerate(percents):
                    expected = slow_probs(run, example, word_scores, percent, mode, unk)
                    assert (removed[j, f, b].item(), kept[j, f, b].item()) == pytest.approx(expected, abs=1e-10)
    finally:
        run.model.float()
