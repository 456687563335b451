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
