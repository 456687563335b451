"""benchmarks/reproduce_sst_audit.py on a tiny run: the JSON it writes holds what the audit stored for each test."""

from __future__ import annotations

import functools
import json
import shutil
import sys
from pathlib import Path

import pytest

from attnaudit.audit import AuditResult, audit
from attnaudit.io import atomic_write_json

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` is a folder of the checkout

from benchmarks import reproduce_sst_audit as rs  # noqa: E402

FAST = {"importance": {"methods": ["gradient"]}, "permutation": {"permutations": 3},
        "erasure": {"rankings": ["attention"], "random_orders": 1},
        "adversarial": {"adversaries": 1, "steps": 5, "report_epsilon": 0.5}}


def test_the_result_holds_each_tests_stored_summary_subset_and_seconds(tmp_path: Path, monkeypatch, tiny_attention_run) -> None:
    tiny = tiny_attention_run("bilstm")
    runs, written = tmp_path / "runs", {}

    def train(task, model, run_dir, data_dir=None, **options):  # the tiny run stands in for the SST BiLSTM
        assert (task, model, options) == ("sst", "bilstm", rs.JOBS[rs.BASE]["options"])
        shutil.copytree(tiny.path, run_dir)

    def write_result(name, payload, indent=2):
        written[name] = payload
        return atomic_write_json(tmp_path / f"{name}.json", payload, indent)

    monkeypatch.setattr(rs, "RUNS", runs)
    monkeypatch.setattr(rs, "train", train)
    monkeypatch.setattr(rs, "write_result", write_result)
    monkeypatch.setattr(rs, "audit", functools.partial(audit, test_options=FAST, figures=False))
    rs.main(["--data-dir", str(tmp_path / "data"), "--limit", "8", "--threads", "1"])

    (name,) = written
    payload = json.loads((tmp_path / f"{name}.json").read_text())
    assert name == "sst_audit_stratified" and payload["limit"] == 8 and payload["limit_order"] == "stratified"
    assert sorted(payload["tests"]) == sorted(rs.TESTS)
    stored = runs / "sst-audit-stratified" / "results"
    for test, row in payload["tests"].items():
        result = json.loads((stored / f"{test}.json").read_text())
        assert row == {"summary": result["summary"], "subset": result["meta"]["subset"], "seconds": result["meta"]["seconds"]}
        assert row["subset"]["n"] == 8 and row["subset"]["split"] == "test"
    metrics = json.loads((runs / rs.BASE / "metrics.json").read_text())
    assert payload["run"]["test_accuracy"] == metrics["test"]["accuracy"]


def test_a_test_that_did_not_finish_stops_the_script_before_its_result_is_written(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="adversarial: ran out of memory"):
        rs.collect(AuditResult(out=tmp_path, failed={"adversarial": "ran out of memory"}))


def test_the_results_page_shows_the_stratified_audit_as_the_json_holds_it() -> None:
    """The results page's rows for the 200 audited SST sentences (importance, permutation, adversarial, erasure and
    erase-until-flip) read from ``sst_audit_stratified.json``, which comes from a clean commit by the script named there."""
    root = Path(__file__).resolve().parents[1]
    result = json.loads((root / "benchmarks" / "results" / "sst_audit_stratified.json").read_text())
    page = (root / "docs" / "sections" / "results.md").read_text()
    section = " ".join(page[page.index("**The other tests, default protocol.**"):page.index("What moved with the balanced sample")].split())
    assert not result["commit"].endswith("-dirty") and f"rerun from clean {result['commit'][:7]}" in section
    assert result["command"].endswith("benchmarks/reproduce_sst_audit.py --data-dir ../shared/data --threads 1")
    assert "`python benchmarks/reproduce_sst_audit.py --data-dir ../shared/data --threads 1`" in section
    assert f"test accuracy {result['run']['test_accuracy']:.4f} again) and runs that audit" in section
    imp, per, adv, era = (result["tests"][t]["summary"] for t in ("importance", "permutation", "adversarial", "erasure"))
    assert all(result["tests"][t]["subset"]["n"] == result["limit"] == 200 for t in rs.TESTS)

    def pct(x: float) -> str:
        return f"{100 * x:.0f}%"

    pairs = ("attention_vs_gradient", "attention_vs_loo", "gradient_vs_loo")
    assert (" / ".join(f"{imp[f'tau_{p}_mean']:.3f}" for p in pairs) + " ("
            + " / ".join(pct(imp[f"tau_{p}_significant"]) for p in pairs) + " significant)") in section
    assert f"| {pct(per['fraction_insensitive'])} (median of medians {per['median_change_median']:.3f})" in section
    assert per["n_evaluated"] == 200 and per["permutations"] == 100 and per["threshold"] == 0.05
    assert f"| {pct(adv['fraction_with_valid'])}, mean max JSD {adv['max_jsd_mean']:.3f}" in section
    assert adv["epsilon"] == 0.01 and adv["adversaries_total"] == 5 * 200
    assert (f"| {pct(era['single_top_beats_random'])} (flip rate {100 * era['single_flip_rate_max']:.1f}% vs "
            f"{100 * era['single_flip_rate_rand']:.1f}%)") in section
    rankings = ("attention", "random", "gradient_x_attention", "ig")
    assert (" / ".join(f"{era[f'flip_{r}_median_fraction']:.2f}" for r in rankings) + " (never flip: "
            + " / ".join(pct(era[f"flip_{r}_share_never"]) for r in rankings) + ")") in section
