"""Identifiability: effective attention vs scipy's null space, T vs the model's own output, the theory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.linalg import null_space

from attnaudit.errors import AttnAuditError
from attnaudit.experiments.experiment import get_experiment
from attnaudit.experiments.identifiability import clipped_distribution, effective_attention, value_output_products
from attnaudit.experiments.runner import run_test
from attnaudit.models import ModelConfig, build_model
from attnaudit.run import Run, TaskSpec


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 12), rank=st.integers(1, 6), d=st.integers(6, 10), seed=st.integers(0, 10_000))
def test_effective_attention_matches_scipy_null_space(n: int, rank: int, d: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    rank = min(rank, n)
    t = (torch.randn(2, n, rank, generator=g, dtype=torch.float64) @ torch.randn(2, rank, d, generator=g, dtype=torch.float64))
    alpha = torch.randn(2, 5, n, generator=g, dtype=torch.float64).softmax(-1)
    effective, ranks = effective_attention(alpha, t)
    for h in range(2):
        basis = torch.from_numpy(null_space(t[h].T.numpy()))  # left null space of T: {v : v T = 0}
        assert int(ranks[h]) == n - basis.shape[1] == rank
        reference = alpha[h] - alpha[h] @ basis @ basis.T
        torch.testing.assert_close(effective[h], reference, atol=1e-10, rtol=0)
    torch.testing.assert_close(effective @ t, alpha @ t, atol=1e-10, rtol=0)
    if rank == n:  # full row rank: nothing to remove
        torch.testing.assert_close(effective, alpha, atol=1e-10, rtol=0)


def test_clipped_distribution() -> None:
    rows = torch.tensor([[0.5, -0.5, 1.5], [-1.0, -2.0, 0.0]])
    out = clipped_distribution(rows)
    torch.testing.assert_close(out[0], torch.tensor([0.25, 0.0, 0.75]))
    assert torch.isnan(out[1]).all()


def test_head_products_rebuild_the_layer_output(tiny_transformer_run: Run) -> None:
    """sum_h alpha_h T_h + b_O is exactly the attention sub-layer output of the model."""
    model = tiny_transformer_run.model
    batch = next(tiny_transformer_run.batches(tiny_transformer_run.examples("test", 4), 4))
    with torch.no_grad():
        trace = model(batch).trace
        for layer, record in enumerate(trace.layers):
            out, _ = model.layers[layer].attend(record.inputs, record.mask)
            w_v, b_v, w_o, heads = model.value_output_maps(layer)
            for i in range(4):
                real = record.mask[i]
                t = value_output_products(record.inputs[i, real], w_v, b_v, w_o, heads)
                alpha = record.weights[i][:, real][:, :, real]
                rebuilt = (alpha @ t).sum(0) + model.layers[layer].out_proj.bias
                torch.testing.assert_close(rebuilt, out[i, real], atol=1e-5, rtol=1e-5)


def test_theory_holds_on_a_trained_transformer(tiny_transformer_run: Run, tmp_path: Path) -> None:
    result = run_test("identifiability", tiny_transformer_run, out=tmp_path, batch_size=16)
    s = result.summary
    assert s["d_head"] == 8 and s["theory_holds"] and s["rank_bound_holds"]
    assert s["max_output_error"] <= 1e-5
    assert s["long_n"] > 0 and s["long_null_dim_positive_share"] == 1.0
    rows = result.instances
    assert len(rows) == len(tiny_transformer_run.examples("test")) * 2 * 2  # instances x layers x heads
    for row in rows:
        if row["seq_len"] <= row["d_head"] and row["null_dim"] == 0:
            assert row["l1"] < 1e-6
        if row["seq_len"] > row["d_head"]:
            assert row["null_dim"] >= row["seq_len"] - row["d_head"]
    assert s["long_l1_mean"] > 1e-3  # raw attention is not identifiable beyond d_head
    by_length = result.frame("by_length")
    assert np.all(by_length.groupby("layer")["seq_len"].is_monotonic_increasing)
    assert {Path(p).name for p in result.figures} == {"identifiability.png", "identifiability.svg"}


def test_short_sequences_have_identical_effective_attention(tiny_transformer_run: Run) -> None:
    """Sequences no longer than d_head (8): full row rank, so alpha_eff == alpha."""
    experiment = get_experiment("identifiability")
    short = [ex for ex in tiny_transformer_run.examples("train") if len(ex.tokens) <= 8][:6]
    assert short
    result = experiment.run(tiny_transformer_run, short, experiment.Options())
    assert result.summary["long_n"] == 0
    assert all(r["null_dim"] == 0 and r["l1"] < 1e-6 for r in result.instances)


def test_applicability() -> None:
    def run_for(model: str, task_type: str) -> Run:
        config = ModelConfig(model=model, task_type=task_type, vocab_size=10, num_labels=2, embed_dim=8,
                             hidden_dim=4, d_model=8, heads=2, d_ff=16)
        task = TaskSpec("toy", task_type, ["a", "b"])
        return Run(model=build_model(config), collate=lambda xs: None, task=task)  # type: ignore[arg-type,return-value]

    experiment = get_experiment("identifiability")
    assert "per-head value and output projections" in experiment.applies(run_for("bilstm", "classification"))
    assert experiment.applies(run_for("transformer", "tagging")) is None
    with pytest.raises(AttnAuditError, match="does not apply"):
        run_test("identifiability", run_for("cnn", "classification"))


def test_an_llm_figure_colours_its_thirty_layers_without_a_collapsed_layout(tmp_path: Path) -> None:
    """30 layers (SmolLM2): one colour bar instead of 90 legend entries, and no layout warning."""
    import warnings

    from attnaudit.experiments.experiment import Result

    rows = [
        {"layer": layer, "seq_len": n, "l1_mean": 0.1 * layer / n, "jsd_clipped_mean": 0.01 * n, "null_dim_mean": max(0, n - 64)}
        for layer in range(30)
        for n in (10, 40, 80)
    ]
    result = Result(test="identifiability", summary={"d_head": 64}, tables={"by_length": rows})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        paths = get_experiment("identifiability").plot(result, tmp_path)
    assert {p.suffix for p in paths} == {".png", ".svg"} and all(p.stat().st_size > 0 for p in paths)
