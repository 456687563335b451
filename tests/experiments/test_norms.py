"""Norm-based analysis (Kobayashi et al. 2020): the maths against brute force, then end to end."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import spearmanr

from attnaudit.experiments import run_test
from attnaudit.experiments.common.rows import key_tokens
from attnaudit.experiments.norms import categorise, is_punctuation
from attnaudit.explain.helpers.norms import layer_norms, transformed_inputs
from attnaudit.hf import load_hf
from attnaudit.models.interface import AttentionLayer
from attnaudit.run import Run


class _Maps:
    """A stand-in model exposing only ``value_output_maps`` (random W_V, b_V, W_O)."""

    def __init__(self, d: int, heads: int, generator: torch.Generator) -> None:
        self.maps = (
            torch.randn(d, d, generator=generator, dtype=torch.float64),
            torch.randn(d, generator=generator, dtype=torch.float64),
            torch.randn(d, d, generator=generator, dtype=torch.float64),
            heads,
        )

    def value_output_maps(self, layer: int):  # type: ignore[no-untyped-def]
        return self.maps


def brute_force(model: _Maps, record: AttentionLayer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The materialised (B,H,Q,K,d) reference: ‖f_h(x_j)‖, ‖α f_h(x_j)‖ and ‖Σ_h α f_h(x_j)‖."""
    w_v, b_v, w_o, heads = model.value_output_maps(0)
    b, k, d = record.inputs.shape
    dh = d // heads
    v = record.inputs @ w_v + b_v
    f = torch.stack([v[..., h * dh : (h + 1) * dh] @ w_o[h * dh : (h + 1) * dh] for h in range(heads)], 1)  # (B,H,K,d)
    vectors = record.weights[..., None] * f[:, :, None, :, :]  # (B,H,Q,K,d)
    return f.norm(dim=-1), vectors.norm(dim=-1), vectors.sum(1).norm(dim=-1)


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 3),
    tokens=st.integers(1, 6),
    heads=st.sampled_from([1, 2, 4]),
    head_dim=st.integers(1, 4),
    seed=st.integers(0, 10_000),
)
def test_norms_equal_the_materialised_computation(batch: int, tokens: int, heads: int, head_dim: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    d = heads * head_dim
    model = _Maps(d, heads, g)
    weights = torch.randn(batch, heads, tokens, tokens, generator=g, dtype=torch.float64).softmax(-1)
    record = AttentionLayer(
        weights=weights,
        mask=torch.ones(batch, tokens, dtype=torch.bool),
        inputs=torch.randn(batch, tokens, d, generator=g, dtype=torch.float64),
    )
    norms = layer_norms(model, record, 0)  # type: ignore[arg-type]
    fx, weighted, summed = brute_force(model, record)
    torch.testing.assert_close(norms.fx_norm, fx)
    torch.testing.assert_close(norms.weighted_norm, weighted)
    torch.testing.assert_close(norms.summed_norm, summed)


def test_head_vectors_sum_to_the_transformer_attention_output(tiny_transformer_run: Run) -> None:
    """Σ_h Σ_j α_ij f_h(x_j) is our Transformer's attention output before the output bias and residual."""
    run = tiny_transformer_run
    batch = next(run.batches(run.examples("test", 6), 6))
    model = run.model
    with torch.no_grad():
        trace = model(batch).trace
        for layer in range(model.num_attention_layers):
            record = trace[layer]
            attended, _ = model.layers[layer].attend(record.inputs, record.mask)
            f = transformed_inputs(model, record, layer)
            summed = torch.einsum("bhqk,bhkd->bqd", record.weights, f)
            torch.testing.assert_close(summed, attended - model.layers[layer].out_proj.bias, atol=1e-5, rtol=1e-5)


def test_head_vectors_sum_to_the_hf_attention_output(tiny_hf: SimpleNamespace) -> None:
    run = load_hf(tiny_hf.dir, task=tiny_hf.task(), device="cpu")
    batch = next(run.batches(run.data().test, 8))
    captured: list[torch.Tensor] = []
    _, out_proj = run.model.attention_projections(0)
    handle = out_proj.register_forward_hook(lambda _m, _i, o: captured.append(o))
    try:
        with torch.no_grad():
            record = run.model(batch).trace[0]
    finally:
        handle.remove()
    summed = torch.einsum("bhqk,bhkd->bqd", record.weights, transformed_inputs(run.model, record, 0))
    torch.testing.assert_close(summed, captured[0] - out_proj.bias, atol=1e-5, rtol=1e-5)


def test_token_categories() -> None:
    special = {"cls": "[CLS]", "sep": "[SEP]"}
    tokens = ["[CLS]", "the", ".", "--", "!?", "##s", "don't", "[SEP]", ""]
    assert categorise(tokens, special) == [0, 3, 2, 2, 2, 3, 3, 1, 3]
    assert categorise(["[CLS]", ","], {}) == [3, 2]
    assert is_punctuation("...") and not is_punctuation("a.") and not is_punctuation("")


def test_key_tokens_follow_the_pair_transformer_layout(tiny_attention_run) -> None:  # type: ignore[no-untyped-def]
    run = tiny_attention_run("transformer-pair")
    examples = run.examples("test", 3)
    batch = next(run.batches(examples, 3))
    rows = key_tokens(run, batch)
    width = batch.tokens.shape[1]
    assert all(len(r) == width + batch.query.shape[1] for r in rows)
    for row, ex, n in zip(rows, examples, batch.mask.sum(1).tolist()):
        assert row[:n] == ex.tokens and row[width : width + len(ex.query)] == ex.query


def test_norms_end_to_end_on_hf(tiny_hf: SimpleNamespace, tmp_path: Path) -> None:
    run = load_hf(tiny_hf.dir, task=tiny_hf.task(), device="cpu")
    result = run_test("norms", run, split="test", out=tmp_path, seed=0, batch_size=3, heatmap_index=4)
    saved = json.loads((tmp_path / "norms.json").read_text())
    assert saved["summary"] == pytest.approx(result.summary, nan_ok=True)
    assert {Path(p).name for p in result.figures} == {
        "norms_by_category.png", "norms_by_category.svg", "norms_heatmap.png", "norms_heatmap.svg",
    }
    rows = result.tables["layers"]
    assert {r["category"] for r in rows} == {"[CLS]", "[SEP]", "punct", "other"}
    for layer in range(2):
        shares = [r for r in rows if r["layer"] == layer]
        assert sum(r["weight_share"] for r in shares) == pytest.approx(1.0)
        assert sum(r["norm_share"] for r in shares) == pytest.approx(1.0)
    summary = result.summary
    assert summary["special_weight_share"] == pytest.approx(summary["[CLS]_weight_share"] + summary["[SEP]_weight_share"])
    assert summary["finding_holds"] == (
        summary["special_norm_share"] < summary["special_weight_share"] and summary["special_spearman"] < 0
    )
    assert len(result.instances) == 8
    heat = result.tables["heatmap"]
    assert {r["query_token"] for r in heat} == {"[CLS]", "a", "dog", "runs", ",", "the", "plot", "was", "good", "[SEP]"}
    # the reported Spearman ρ is scipy's on the same (α, ‖f(x)‖) pairs: recompute with every pair kept
    everything = run_test("norms", run, split="test", out=tmp_path / "all", max_pairs=10**6, plot=False)
    batch = next(run.batches(run.data().test, 8))
    with torch.no_grad():
        record = run.model(batch).trace[1]
        norms = layer_norms(run.model, record, 1)
    real = (batch.mask[:, None, :, None] & batch.mask[:, None, None, :]).expand_as(norms.weights)
    alpha = norms.weights[real].numpy()
    fx = norms.fx_norm[:, :, None, :].expand_as(norms.weights)[real].numpy()
    expected = spearmanr(alpha, fx)[0]
    assert everything.tables["spearman"][1]["all"] == pytest.approx(expected, abs=1e-6)


def test_norms_on_our_transformer_and_applicability(
    tiny_transformer_run: Run, tiny_attention_run, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    result = run_test("norms", tiny_transformer_run, split="test", limit=10, plot=False, out=tmp_path)
    assert "finding_holds" not in result.summary
    assert any("no [CLS]/[SEP]" in note for note in result.meta["notes"])
    assert np.isfinite(result.summary["other_weight_share"])
    from attnaudit.errors import AttnAuditError

    with pytest.raises(AttnAuditError, match="no per-head value/output projections"):
        run_test("norms", tiny_attention_run("bilstm"), limit=2, plot=False, out=tmp_path)


def test_option_errors(tiny_hf: SimpleNamespace, tmp_path: Path) -> None:
    from attnaudit.errors import AttnAuditError

    run = load_hf(tiny_hf.dir, task=tiny_hf.task(), device="cpu")
    with pytest.raises(AttnAuditError, match="heatmap-layer"):
        run_test("norms", run, out=tmp_path, heatmap_layer=5)
    with pytest.raises(AttnAuditError, match="heatmap-index"):
        run_test("norms", run, out=tmp_path, limit=2, heatmap_index=2)
