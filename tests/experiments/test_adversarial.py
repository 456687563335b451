"""Adversarial attention: objective pieces, bound check, batched vs full-model loop, tiny runs end to end."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnaudit.algorithms.metrics import LN2, jsd
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.adversarial import adversarial_loop
from attnaudit.experiments.attention_search import (
    Search,
    adversary_weights,
    differentiable_jsd,
    initial_logits,
    max_valid_jsd,
    pairwise_divergence,
    search_batch,
)
from attnaudit.experiments.common.applies import resolve_layers
from attnaudit.experiments.common.seeding import seeded_generator
from attnaudit.experiments.experiment import Result
from attnaudit.experiments.runner import run_test
from attnaudit.progress import set_quiet
from attnaudit.run import Run

set_quiet(True)
GetRun = Callable[[str], Run]


# --------------------------------------------------------------------- the bound check


def _reference_max_valid(div: list[list[float]], change: list[list[float]], bound: float) -> tuple[list[float], list[int]]:
    best, counts = [], []
    for ds, cs in zip(div, change):
        valid = [d for d, c in zip(ds, cs) if not math.isnan(c) and c <= bound]
        best.append(max(valid) if valid else math.nan)
        counts.append(len(valid))
    return best, counts


finite_or_nan = st.one_of(st.floats(0.0, 1.0), st.just(math.nan))


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 4).flatmap(
        lambda a: st.tuples(
            st.lists(st.lists(st.floats(0.0, LN2), min_size=a, max_size=a), min_size=1, max_size=5),
            st.lists(st.lists(finite_or_nan, min_size=a, max_size=a), min_size=1, max_size=5),
        )
    ),
    st.floats(0.0, 0.2),
)
def test_max_valid_jsd_counts_only_adversaries_within_the_bound(
    arrays: tuple[list[list[float]], list[list[float]]], bound: float
) -> None:
    div, change = arrays
    n = min(len(div), len(change))
    div, change = div[:n], change[:n]
    best, counts = max_valid_jsd(torch.tensor(div, dtype=torch.float64), torch.tensor(change, dtype=torch.float64), bound)
    want_best, want_counts = _reference_max_valid(div, change, bound)
    np.testing.assert_array_equal(best.numpy(), np.array(want_best))  # NaN where none is valid
    assert counts.tolist() == want_counts


# --------------------------------------------------------------------- objective pieces


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 8), st.integers(0, 2**31 - 1))
def test_differentiable_jsd_matches_metrics_and_has_finite_gradients(k: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, k, generator=g, dtype=torch.float64)
    zeros = torch.rand(3, k, generator=g) < 0.4
    zeros[:, 0] = False
    logits.requires_grad_(True)
    p = logits.masked_fill(zeros, float("-inf")).softmax(-1)
    q = torch.rand(3, k, generator=g, dtype=torch.float64).masked_fill(zeros, 0.0)
    q = q / q.sum(-1, keepdim=True)
    value = differentiable_jsd(p, q)
    torch.testing.assert_close(value, jsd(p, q))
    (grad,) = torch.autograd.grad(value.sum(), logits)
    assert torch.isfinite(grad).all()


def test_padding_and_padding_queries_are_left_alone() -> None:
    key_mask = torch.tensor([[True, True, False]])
    query_rows = torch.tensor([[True, False]])
    theta = initial_logits(key_mask[0], query_rows[0], 4, 2, seeded_generator(0, 0))
    assert theta.shape == (4, 2, 2, 3) and torch.all(theta[..., 2] == 0) and torch.all(theta[:, :, 1] == 0)
    original = torch.full((1, 2, 2, 3), 0.5).masked_fill(~key_mask[:, None, None, :], 0.0)
    weights = adversary_weights(theta[None], key_mask, query_rows, original)
    assert torch.all(weights[..., 2] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 4, 2, 2))
    assert torch.equal(weights[:, :, :, 1], original[:, None, :, 1].expand(1, 4, 2, 3))
    single = pairwise_divergence(weights[:, :1], query_rows)
    assert single.tolist() == [0.0]


# --------------------------------------------------------------------- batched == per-instance loop


@pytest.mark.parametrize("name", ["bilstm", "transformer-pair", "han"])
def test_batched_search_equals_full_model_loop(tiny_attention_run: GetRun, name: str) -> None:
    run = tiny_attention_run(name)
    examples = run.examples("test", 4)
    (layer,) = resolve_layers(run.model, "explained")
    search = Search(adversaries=3, steps=8, epsilon=0.01, report_epsilon=0.01)
    ours = search_batch(run.model, run.collate(examples), layer, search, seed=2, indices=range(4))
    div, change = adversarial_loop(run, examples, layer, search, seed=2)
    np.testing.assert_allclose(ours.jsd.numpy(), div, atol=1e-5)
    np.testing.assert_allclose(ours.change.numpy(), change, atol=1e-5)
    assert ours.decode_calls == search.steps + 2  # one decode per step for the whole batch, plus the recheck
    assert not torch.isnan(ours.weights).any()


# --------------------------------------------------------------------- end to end


def _check_saved(path: Path, bound: float) -> Result:
    """Every counted adversary meets the bound per the saved Δŷ; JSDs lie in [0, ln 2]."""
    result = Result.load(path)
    table = result.tables["adversaries"]
    assert table, "no adversaries saved"
    for row in table:
        assert 0.0 <= row["jsd"] <= LN2 + 1e-9
        assert row["valid"] == (row["output_change"] <= bound)
    for inst in result.instances:
        valid = [r["jsd"] for r in table if r["index"] == inst["index"] and r["valid"]]
        assert inst["valid_adversaries"] == len(valid)
        if valid:
            assert inst["max_jsd"] == pytest.approx(max(valid))
            assert inst["best_output_change"] <= bound
        else:
            assert inst["max_jsd"] is None  # NaN in strict JSON
    return result


@pytest.mark.parametrize("name", ["bilstm", "han", "transformer", "pair"])
def test_end_to_end_reports_only_adversaries_within_the_bound(tiny_attention_run: GetRun, name: str, tmp_path: Path) -> None:
    run = tiny_attention_run(name)
    result = run_test(
        "adversarial", run, limit=5, seed=0, out=tmp_path, plot=name == "bilstm", adversaries=3, steps=25
    )
    bound = 0.05 if name == "pair" else 0.01  # task-type default of ε, reported under it
    assert result.summary["epsilon"] == result.summary["report_epsilon"] == bound
    loaded = _check_saved(tmp_path / "adversarial.json", bound)
    assert len(loaded.instances) == 5 and loaded.summary["adversaries_total"] == 15
    assert loaded.summary["n_without_valid"] + round(loaded.summary["fraction_with_valid"] * 5) == 5
    if name == "bilstm":
        stems = {Path(f).name for f in loaded.figures}
        assert {"adversarial_histogram.png", "adversarial_vs_max_attention.svg"} <= stems


def test_best_adversary_is_stored_with_the_original_attention(tiny_attention_run: GetRun, tmp_path: Path) -> None:
    """Per instance with a valid adversary: the model's own attention (recomputed alone) and the
    reported adversary, whose JSD to it is the row's max_jsd (one head, one query: no averaging)."""
    run = tiny_attention_run("bilstm")
    result = run_test("adversarial", run, limit=5, seed=0, out=tmp_path, plot=False, adversaries=3, steps=25)
    rows = {r["index"]: r for r in result.instances}
    stored = Result.load(tmp_path / "adversarial.json").tables["best_adversary"]
    assert stored and [b["index"] for b in stored] == [i for i, r in rows.items() if r["valid_adversaries"] > 0]
    examples = run.examples("test", 5)
    for best in stored:
        batch = run.collate([examples[best["index"]]]).to(run.device)
        with torch.no_grad():
            own = run.model(batch).trace[run.model.explained_layer].weights[0, 0, 0]
        assert best["original"] == pytest.approx(own.tolist(), abs=1e-5)
        adversary = torch.tensor(best["adversary"], dtype=torch.float64)
        assert float(adversary.sum()) == pytest.approx(1.0, abs=1e-4)
        divergence = float(jsd(adversary[None], own.double()[None])[0])
        assert divergence == pytest.approx(rows[best["index"]]["max_jsd"], abs=1e-4)


def test_tight_report_bound_rejects_and_is_rechecked(tiny_attention_run: GetRun, tmp_path: Path) -> None:
    run = tiny_attention_run("bilstm")
    tight = run_test("adversarial", run, limit=4, out=tmp_path / "a", plot=False, adversaries=2, steps=10, report_epsilon=0.0)
    _check_saved(tmp_path / "a" / "adversarial.json", 0.0)
    loose = run_test("adversarial", run, limit=4, out=tmp_path / "b", plot=False, adversaries=2, steps=10, report_epsilon=0.5)
    _check_saved(tmp_path / "b" / "adversarial.json", 0.5)
    assert tight.summary["adversaries_valid"] <= loose.summary["adversaries_valid"] == 8
    assert loose.summary["epsilon"] == 0.01


def test_same_seed_same_numbers(tiny_attention_run: GetRun, tmp_path: Path) -> None:
    run = tiny_attention_run("transformer")
    kwargs = {"limit": 4, "plot": False, "adversaries": 2, "steps": 8}
    first = run_test("adversarial", run, seed=3, out=tmp_path / "a", **kwargs)
    again = run_test("adversarial", run, seed=3, out=tmp_path / "b", **kwargs)
    other = run_test("adversarial", run, seed=4, out=tmp_path / "c", **kwargs)
    assert first.instances == again.instances and first.tables == again.tables
    assert first.tables != other.tables


def test_options_are_validated(tiny_attention_run: GetRun, tmp_path: Path) -> None:
    run = tiny_attention_run("transformer")
    with pytest.raises(AttnAuditError, match="not supported by this test"):
        run_test("adversarial", run, limit=2, out=tmp_path, layer="all")
    with pytest.raises(AttnAuditError, match="at least 1"):
        run_test("adversarial", run, limit=2, out=tmp_path, adversaries=0)
    with pytest.raises(AttnAuditError, match="tagger predicts one label per token"):
        run_test("adversarial", tiny_attention_run("tagger"), limit=2, out=tmp_path)
