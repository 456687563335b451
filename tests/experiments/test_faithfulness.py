"""The faithfulness scoreboard end to end: tiny BiLSTM, Transformer and BERT runs, the registry as the
only source of methods, the CSV/JSON outputs, the report section, and the command line."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from attnaudit.errors import AttnAuditError
from attnaudit.experiments.eraser_metrics import describe
from attnaudit.experiments.experiment import Result
from attnaudit.experiments.runner import run_test
from attnaudit.explain import EXPLANATIONS, Explanation, item_mask, list_explanations, register, unregister
from tests.reliability.helpers import assert_clean_failure, cli

FAST = {"ig_steps": 2, "resamples": 50, "curve_steps": 4}


def check_result(result: Result, out: Path, methods: list[str], modes: list[str]) -> None:
    """Files, scoreboard shape, per-instance AOPC = mean of its bins, CIs around the means."""
    board = pd.read_csv(out / "faithfulness_scoreboard.csv")
    assert sorted(board["method"].unique()) == sorted(methods) and sorted(board["mode"].unique()) == sorted(modes)
    for column in ("aopc_comp", "aopc_comp_low", "aopc_comp_high", "aopc_suff", "deletion", "insertion", "rank_aopc_comp"):
        assert column in board.columns
    frame = pd.read_csv(out / "faithfulness.csv")
    assert len(frame) == result.summary["n"] > 0
    bins = sorted({float(r["percent"]) for r in result.tables["bins"]})
    for method in methods:
        for mode in modes:
            for key in ("comp", "suff"):
                per_bin = frame[[f"{method}_{mode}_{key}@{b:g}" for b in bins]].to_numpy()
                np.testing.assert_allclose(frame[f"{method}_{mode}_aopc_{key}"], per_bin.mean(1), atol=1e-12)
            row = board[(board["method"] == method) & (board["mode"] == mode)].iloc[0]
            values = frame[f"{method}_{mode}_aopc_comp"].to_numpy()
            assert row["aopc_comp"] == pytest.approx(values.mean())
            assert row["aopc_comp_low"] <= row["aopc_comp"] <= row["aopc_comp_high"]
            stats = describe(values, result.meta["seed"], result.meta["options"]["resamples"])
            assert (row["aopc_comp_low"], row["aopc_comp_high"]) == pytest.approx((stats["ci_low"], stats["ci_high"]))
        ranked = board[board["mode"] == modes[0]]
        assert list(ranked["aopc_comp"]) == sorted(ranked["aopc_comp"], reverse=True)
    agreement = pd.read_csv(out / "faithfulness_agreement.csv")
    assert len(agreement) == len(methods) ** 2
    assert (agreement[agreement["a"] == agreement["b"]]["tau"] == 1.0).all()
    for stem in ("faithfulness_aopc", "faithfulness_curves"):
        assert (out / f"{stem}.png").is_file()


@pytest.mark.parametrize("name", ["bilstm", "transformer"])
def test_scoreboard_on_tiny_runs_takes_every_method_from_the_registry(name: str, tiny_attention_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run = tiny_attention_run(name)
    result = run_test("faithfulness", run, out=tmp_path, limit=12, **FAST)
    methods = [m.name for m in list_explanations(run)]
    assert result.meta["methods"] == methods
    skipped = {n.split(": ")[1] for n in result.meta["notes"] if n.startswith("not scored: ")}
    assert skipped == {m for m in EXPLANATIONS if m not in methods}  # every registered method, scored or said why not
    check_result(result, tmp_path, methods, ["delete", "mask"])
    assert result.meta["filler"] == "<unk>"
    # the synthetic task carries rationales: plausibility per method, within [0, 1]
    board = result.frame("scoreboard")
    assert board["auprc"].between(0, 1).all() and board["token_f1"].between(0, 1).all()
    assert (tmp_path / "faithfulness_agreement.png").is_file()


def test_a_newly_registered_method_joins_the_scoreboard(tiny_attention_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run = tiny_attention_run("bilstm")

    def position(model, batch):  # type: ignore[no-untyped-def]
        mask = item_mask(model, batch)
        return torch.arange(mask.shape[1], dtype=torch.float32).expand_as(mask) * mask

    register(Explanation("test_position", position, "later tokens first (a test method)"))
    try:
        result = run_test("faithfulness", run, out=tmp_path, limit=6, mode="mask", bins=[20.0, 50.0], **FAST)
        assert "test_position" in result.meta["methods"]
        assert result.meta["methods"] == [m.name for m in list_explanations(run)]
    finally:
        unregister("test_position")
    assert "test_position" in set(pd.read_csv(tmp_path / "faithfulness_scoreboard.csv")["method"])


def test_scoreboard_on_a_tiny_bert_masks_with_mask_token(tiny_hf, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from attnaudit.hf import load_hf

    run = load_hf(tiny_hf.dir, task=tiny_hf.task(), device="cpu")
    methods = ["attention", "gradient", "rollout", "norms", "random"]
    result = run_test("faithfulness", run, out=tmp_path, methods=methods, **FAST)
    assert result.meta["filler"] == "[MASK]"
    check_result(result, tmp_path, methods, ["delete", "mask"])
    assert result.summary["excluded_short"] == 1  # "good": one word, nothing to remove but everything


def test_options_refused_in_one_line(tiny_attention_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run = tiny_attention_run("bilstm")
    for options, message in (({"mode": "erase"}, "--mode"), ({"bins": [0.0]}, "--bins"), ({"bins": [100.0]}, "--bins"),
                             ({"methods": ["nope"]}, "nope"), ({"topk": 0.0}, "--topk"), ({"resamples": 1}, "--resamples")):
        with pytest.raises(AttnAuditError, match=message):
            run_test("faithfulness", run, out=tmp_path, limit=4, **options)


def test_does_not_apply_to_a_tagger(tiny_attention_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(AttnAuditError, match="does not apply"):
        run_test("faithfulness", tiny_attention_run("tagger"), out=tmp_path, limit=4)


def test_verdict_ranks_methods_and_report_shows_the_section(tiny_attention_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from attnaudit.report import build_report

    run = tiny_attention_run("bilstm")
    result = run_test("faithfulness", run, out=tmp_path, limit=8, methods=["attention", "gradient", "random"], mode="delete", **FAST)
    rows = {r["statistic"]: r for r in get_verdict(result)}
    board = sorted(result.tables["scoreboard"], key=lambda r: -r["aopc_comp"])
    assert rows["aopc_comp_ranking_delete"]["value"] == board[0]["method"]
    assert "attention ranks" in rows["aopc_comp_ranking_delete"]["interpretation"]
    html = build_report(tmp_path).read_text()
    assert 'id="test-faithfulness"' in html and "aopc_comp_ranking_delete" in html and "faithfulness_aopc" in html


def get_verdict(result: Result) -> list[dict]:  # type: ignore[type-arg]
    from attnaudit.experiments import get_experiment

    return get_experiment("faithfulness").verdict(result)


def test_cli_runs_and_refuses_bad_options(tiny_attention_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run = tiny_attention_run("bilstm")
    out = tmp_path / "out"
    proc = cli("run", "faithfulness", run.path, "--methods", "attention,random", "--mode", "mask", "--bins", "10,50",
               "--limit", "6", "--seed", "3", "--resamples", "20", "--out", out, "--quiet")
    assert proc.returncode == 0, proc.stderr
    result = Result.load(out / "faithfulness.json")
    assert result.meta["modes"] == ["mask"] and result.meta["seed"] == 3
    assert sorted({r["percent"] for r in result.tables["bins"]}) == [10.0, 50.0]
    bad = tmp_path / "bad"
    assert_clean_failure(cli("run", "faithfulness", run.path, "--mode", "erase", "--out", bad, "--quiet"), "--mode", out=bad)
    assert_clean_failure(cli("run", "faithfulness", run.path, "--bins", "5,x", "--out", bad, "--quiet"), "--bins", out=bad)


def test_seeded_results_repeat(tiny_attention_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run = tiny_attention_run("transformer")
    options = {"limit": 6, "methods": ["attention", "random", "loo"], "mode": "mask", **FAST}
    first = run_test("faithfulness", run, out=tmp_path / "a", seed=5, **options)
    second = run_test("faithfulness", run, out=tmp_path / "b", seed=5, **options)
    assert first.tables["scoreboard"] == second.tables["scoreboard"]
    assert all(math.isfinite(r["aopc_comp"]) for r in first.tables["scoreboard"])


def test_instances_come_back_in_input_order_whatever_the_batching(tiny_attention_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Batches are grouped by length inside the test; the CSV keeps the examples' order and each row's
    values are those of that example scored alone (batch size 1: no grouping, no padding)."""
    run = tiny_attention_run("transformer")
    options = {"limit": 10, "methods": ["attention", "loo"], "mode": "delete", **FAST}
    grouped = run_test("faithfulness", run, out=tmp_path / "a", batch_size=4, **options)
    alone = run_test("faithfulness", run, out=tmp_path / "b", batch_size=1, **options)
    a, b = grouped.frame(), alone.frame()
    assert list(a["index"]) == sorted(a["index"]) and list(a["index"]) == list(b["index"])
    lengths = [len(e.tokens) for e in run.examples("test", 10)]
    assert lengths != sorted(lengths)  # the grouping did reorder
    numeric = [c for c in a.columns if c.startswith(("attention_", "loo_"))]
    np.testing.assert_allclose(a[numeric].to_numpy(float), b[numeric].to_numpy(float), atol=1e-5)
