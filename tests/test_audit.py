"""The one-command audit: outputs, resuming, option overrides, failures, CLI parsing."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import torch

from attnaudit.audit import audit, parse_settings
from attnaudit.data.synthetic import synthetic_task
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.experiment import EXPERIMENTS, AuditSettings, Experiment, Result, register
from attnaudit.explain import EXPLANATIONS
from attnaudit.explain.methods.gradient import gradient_importance as explain_gradient
from attnaudit.explain.registry import _MEMOS
from attnaudit.progress import set_quiet
from attnaudit.report.summary import SUMMARY_COLUMNS, order_tests, verdict_rows
from attnaudit.training.trainer import train

set_quiet(True)
SMALL = {"permutation": {"permutations": 4}, "rationale": {"ig_steps": 2, "methods": ["attention", "gradient"]}}
TESTS = ["rationale", "permutation"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    data = synthetic_task("classification", seed=0, n_train=160, n_dev=20, n_test=20)
    return train(data, "bilstm", tmp_path_factory.mktemp("run"), epochs=1, embed_dim=8, hidden_dim=8, quiet_eval=True)


@pytest.fixture
def failing_test():
    """A registered test that always fails (removed again afterwards)."""

    @register
    class Broken(Experiment):
        name = "zz-broken"
        description = "always fails"

        @dataclass
        class Options:
            pass

        def run(self, run, examples, options, seed=0):
            raise RuntimeError("deliberate failure\nsecond line")

    yield "zz-broken"
    EXPERIMENTS.pop("zz-broken")


def test_audit_writes_results_summary_and_report(run, tmp_path: Path) -> None:
    out = tmp_path / "audit"
    result = audit(out, run=run, only=TESTS, limit=6, test_options=SMALL)
    assert result.ok and set(result.results) == set(TESTS)
    for name in TESTS:
        stored = Result.load(out / "results" / f"{name}.json")
        assert stored.meta["audit"]["options_hash"]
    assert stored.meta["options"]["permutations"] == 4  # the override reached the test
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary.columns) == SUMMARY_COLUMNS
    assert set(summary["test"]) == set(TESTS)
    assert summary.query("test == 'rationale' and statistic == 'attention_map'")["interpretation"].str.contains("random").all()
    assert result.report == out / "report.html" and result.report.exists()
    log = json.loads((out / "audit.json").read_text())
    assert [t["test"] for t in log["tests"]] == TESTS  # cheap-first order, rationale before permutation
    heatmaps = json.loads((out / "results" / "heatmaps.json").read_text())
    assert heatmaps["instances"] and set(heatmaps["instances"][0]["scores"]) == {"attention", "gradient", "loo", "ig"}


def test_resume_reuses_stored_results_and_matches_uninterrupted(run, tmp_path: Path) -> None:
    out = tmp_path / "audit"
    first = audit(out, run=run, only=TESTS, limit=6, test_options=SMALL)
    stamp = (out / "results" / "rationale.json").stat().st_mtime_ns
    (out / "results" / "permutation.json").unlink()  # as if the audit had been killed during permutation
    second = audit(out, run=run, only=TESTS, limit=6, test_options=SMALL)
    assert (out / "results" / "rationale.json").stat().st_mtime_ns == stamp  # reused, not rerun
    log = {t["test"]: t["status"] for t in json.loads((out / "audit.json").read_text())["tests"]}
    assert log == {"rationale": "cached", "permutation": "done"}
    assert second.results["permutation"].summary == first.results["permutation"].summary
    assert second.results["permutation"].instances == first.results["permutation"].instances
    changed = audit(out, run=run, only=["permutation"], limit=6, test_options={"permutation": {"permutations": 5}})
    assert changed.results["permutation"].meta["options"]["permutations"] == 5  # other options: recomputed


def test_failure_is_recorded_and_others_still_run(run, tmp_path: Path, failing_test: str) -> None:
    out = tmp_path / "audit"
    result = audit(out, run=run, only=["rationale", failing_test], limit=4, test_options=SMALL)
    assert not result.ok
    assert result.failed == {failing_test: "RuntimeError: deliberate failure"}
    assert "rationale" in result.results
    summary = pd.read_csv(out / "summary.csv")
    row = summary[summary["test"] == failing_test].iloc[0]
    assert row["statistic"] == "error" and "deliberate failure" in row["interpretation"]
    assert "deliberate failure" in (out / "report.html").read_text()


def test_transformer_only_tests_are_skipped_for_rnns(run, tmp_path: Path) -> None:
    result = audit(tmp_path / "audit", run=run, only=["shuffle"], limit=4)
    assert "Transformers only" in result.skipped["shuffle"]
    assert pd.read_csv(tmp_path / "audit" / "summary.csv")["statistic"].tolist() == ["skipped"]


def test_bad_arguments_fail_before_any_work(run, tmp_path: Path) -> None:
    with pytest.raises(AttnAuditError, match="unknown test"):
        audit(tmp_path, run=run, only=["nope"])
    with pytest.raises(AttnAuditError, match="unknown option"):
        audit(tmp_path, run=run, only=["permutation"], test_options={"permutation": {"nope": 1}})
    with pytest.raises(AttnAuditError, match="exactly one"):
        audit(tmp_path, run=run, model="bilstm", task="synthetic")
    with pytest.raises(AttnAuditError, match="exactly one"):
        audit(tmp_path)
    assert not (tmp_path / "results").exists()


def test_parse_settings_types_values() -> None:
    parsed = parse_settings(["permutation.permutations=20", "permutation.threshold=0.05", "rationale.methods=attention,loo"])
    assert parsed == {"permutation": {"permutations": 20, "threshold": 0.05}, "rationale": {"methods": ["attention", "loo"]}}
    for bad, message in [
        ("permutation", "TEST.OPTION=VALUE"),
        ("nope.x=1", "unknown test"),
        ("permutation.nope=1", "unknown option"),
        ("permutation.permutations=many", "expected int"),
    ]:
        with pytest.raises(AttnAuditError, match=message):
            parse_settings([bad])


def test_order_is_cheap_first() -> None:
    assert order_tests(["seeds", "zeta", "permutation", "identifiability", "uniform"]) == [
        "identifiability", "permutation", "zeta", "uniform", "seeds",
    ]


def test_cli_exits_nonzero_when_a_test_fails(run, tmp_path: Path, failing_test: str, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from attnaudit import cli

    out = tmp_path / "cli"
    argv = ["attnaudit", "audit", "--run", str(run.path), "--out", str(out), "--only", "rationale", "--only", failing_test,
            "--limit", "4", "--set", "rationale.ig_steps=2", "--quiet"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 2
    assert "1 test(s) failed: zz-broken" in capsys.readouterr().err
    assert Result.load(out / "results" / "rationale.json").meta["options"]["ig_steps"] == 2
    assert (out / "report.html").exists()


def test_trains_into_out_run_when_given_task_and_model(tmp_path: Path) -> None:
    options = {"epochs": 1, "embed_dim": 4, "hidden_dim": 4}
    result = audit(tmp_path, task="synthetic", model="average", only=["rationale"], limit=3,
                   test_options={"rationale": {"methods": ["attention"]}}, **options)
    assert result.ok and (tmp_path / "run" / "model.safetensors").exists()
    assert json.loads((tmp_path / "audit.json").read_text())["run"] == str(tmp_path / "run")
    with pytest.raises(AttnAuditError, match="only apply with --task/--model"):
        audit(tmp_path, run=tmp_path / "run", epochs=1)


def test_default_verdict_lists_summary_beside_published_and_survives_broken_verdicts() -> None:
    result = Result(test="zz-none", summary={"tau": 0.3, "n": 4}, meta={"published": {"tau": 0.351, "source": "J&W"}})
    assert Experiment().verdict(result) == [
        {"statistic": "tau", "value": 0.3, "published": 0.351, "interpretation": ""},
        {"statistic": "n", "value": 4, "published": "", "interpretation": ""},
    ]

    class Faulty(Experiment):
        name = "zz-faulty"

        def verdict(self, result):
            raise KeyError("missing_statistic")

    EXPERIMENTS["zz-faulty"] = Faulty
    try:
        rows = verdict_rows("zz-faulty", result)
    finally:
        EXPERIMENTS.pop("zz-faulty")
    assert [r["statistic"] for r in rows] == ["tau", "n", "verdict"]
    assert "verdict failed: KeyError" in rows[-1]["interpretation"] and all(r["test"] == "zz-faulty" for r in rows)


def test_tests_share_scores_until_one_changes_the_weights(run, tmp_path: Path) -> None:
    """The gradient one test computed is handed to the next test of the audit; a test that leaves the
    weights changed has them restored, and the scores of the changed weights are dropped."""
    seen: list[tuple[str, int, bool]] = []  # (test, memo entries before its call, scores equal a fresh computation)

    def reader(name: str, rank: int, spoil: bool) -> type[Experiment]:
        class Reader(Experiment):
            description = "reads the gradient of the first batch" + (", then changes the weights" if spoil else "")

            @dataclass
            class Options:
                pass

            def run(self, run, examples, options, seed=0):  # type: ignore[no-untyped-def]
                batch = next(run.batches(examples, 4))
                before = len(next(iter(_MEMOS.values())))
                scores = EXPLANATIONS["gradient"](run.model, batch)
                seen.append((self.name, before, torch.equal(scores, explain_gradient(run.model, batch))))
                if spoil:
                    with torch.no_grad():
                        next(run.model.parameters()).add_(1.0)
                return Result(test=self.name, summary={"n": len(examples)})

        Reader.name, Reader.settings = name, AuditSettings(rank=rank)
        return register(Reader)

    tests = [("zz-first", 1, False), ("zz-spoiler", 2, True), ("zz-after", 3, False)]
    for test in tests:
        reader(*test)
    before = {k: v.clone() for k, v in run.model.state_dict().items()}
    try:
        result = audit(tmp_path / "a", run=run, only=[t[0] for t in tests], limit=6, figures=False, explore=0, heatmap_instances=0)
        # zz-spoiler finds zz-first's scores (a row per example of the batch of 4); zz-after finds none
        # (they were of the changed weights)
        assert result.ok and seen == [("zz-first", 0, True), ("zz-spoiler", 4, True), ("zz-after", 0, True)]
        assert all(torch.equal(before[k], v) for k, v in run.model.state_dict().items())  # restored
    finally:
        for test in tests:
            EXPERIMENTS.pop(test[0])


def test_the_audit_says_what_it_tests_before_working_and_offers_the_whole_file(tiny_hf, tmp_path) -> None:
    """A user's CSV without a test file: the test split is 10 % of it, said up front, and ``--split all`` audits every row."""
    from attnaudit.audit import audited_line
    from attnaudit.hf import load_hf

    path = tmp_path / "reviews.csv"
    path.write_text("text,label\n" + "".join("the movie was good,pos\nbad plot,neg\n" for _ in range(20)), encoding="utf-8")
    run = load_hf(tiny_hf.dir, task=f"csv:{path}", device="cpu")
    line = audited_line(run, "test", None, None, "stratified", 0)
    assert line == ("audited: the test split, 4 of its 4 instances (all); "
                    "the test split is 10 % of the data (40 instances): --split all audits every one")
    assert audited_line(run, "all", 10, None, "first", 0) == "audited: every split (train, dev and test), 10 of its 40 instances (first)"
    assert len(run.examples("all")) == 40
