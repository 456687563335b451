"""Resuming trusts only results computed for this run, and an audit never writes into the run it reads.

* A stored result is reused only when it names the test and its fingerprint (options, data
  files, model, package version...) recomputes to the same hash; anything else is recomputed
  and ``audit.json`` says why.
* Temporary files a killed process left behind are removed when the next audit, test or
  training starts in that folder.
* ``attnaudit audit --run R --out O`` writes its sub-runs under ``O``; every file of ``R`` is
  left byte-identical, while finished sub-runs already under ``R`` are reused, not retrained.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import attnaudit
from attnaudit.audit import audit
from attnaudit.experiments.experiment import Result
from attnaudit.experiments.runner import run_test
from attnaudit.progress import set_quiet
from attnaudit.run import Run
from attnaudit.training.trainer import train

from .helpers import synthetic_rows, write_table

set_quiet(True)
CHEAP = ["importance", "permutation"]
SMALL = {"importance": {"methods": ["gradient"]}, "permutation": {"permutations": 3}}
LIMIT = 6
TRAINING = {
    "uniform": {"epochs": 1, "seeds": [1]},
    "seeds": {"epochs": 1, "seeds": [1]},
    "diagnostic": {"epochs": 1, "seeds": [1]},
    "global-adversary": {"epochs": 1, "lambdas": [0.0, 1.0]},
    "probe": {"epochs": 1, "lambdas": [1.0], "variants": ["frozen"], "seeds": [1]},
}


def _train(folder: Path, model: str = "bilstm") -> Run:
    """A tiny run trained for one epoch on CSV files in ``folder`` (the data files it reads)."""
    if not (folder / "train.csv").exists():
        rows = synthetic_rows(140)
        write_table(folder / "train.csv", rows[:120])
        write_table(folder / "test.csv", rows[120:])
    sizes = {"embed_dim": 8, "hidden_dim": 8} if model == "bilstm" else {"embed_dim": 8, "d_model": 8, "heads": 1, "layers": 1, "d_ff": 16}
    return train(f"csv:{folder / 'train.csv'}", model, folder / "run", test=f"csv:{folder / 'test.csv'}", epochs=1, quiet_eval=True, **sizes)


def _log(out: Path) -> dict[str, dict]:
    return {entry["test"]: entry for entry in json.loads((out / "audit.json").read_text())["tests"]}


def _cheap_audit(out: Path, run: Run | Path) -> None:
    audit(out, run=run, only=CHEAP, limit=LIMIT, test_options=SMALL, figures=False)


def _tree(root: Path) -> dict[str, str]:
    """Every file and folder under ``root`` with its content hash: equal trees are byte-identical."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
    }


def test_a_result_renamed_to_another_test_is_recomputed(trained: Run, tmp_path: Path) -> None:
    out = tmp_path / "audit"
    _cheap_audit(out, trained.path)
    results = out / "results"
    original = json.loads((results / "importance.json").read_text())
    renamed = {**original, "test": "permutation"}  # still a valid result file, options hash intact
    (results / "importance.json").write_text(json.dumps(renamed))
    _cheap_audit(out, trained.path)
    entry = _log(out)["importance"]
    assert entry["status"] == "done" and "'permutation'" in entry["recomputed"]
    assert Result.load(results / "importance.json").test == "importance"
    assert _log(out)["permutation"]["status"] == "cached"  # the untouched result is still reused


def test_another_tests_result_under_this_name_is_recomputed(trained: Run, tmp_path: Path) -> None:
    out = tmp_path / "audit"
    _cheap_audit(out, trained.path)
    results = out / "results"
    original = json.loads((results / "importance.json").read_text())
    forged = json.loads((results / "permutation.json").read_text())
    forged["test"] = "importance"
    forged["meta"]["audit"] = original["meta"]["audit"]  # what the audit used to resume by
    (results / "importance.json").write_text(json.dumps(forged))
    _cheap_audit(out, trained.path)
    entry = _log(out)["importance"]
    assert entry["status"] == "done" and entry["recomputed"]
    assert Result.load(results / "importance.json").summary == original["summary"]


def test_a_changed_data_file_or_version_recomputes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = _train(tmp_path)
    out = tmp_path / "audit"
    _cheap_audit(out, run.path)
    _cheap_audit(out, run.path)
    assert {t: e["status"] for t, e in _log(out).items()} == {"importance": "cached", "permutation": "cached"}

    write_table(tmp_path / "test.csv", synthetic_rows(20, seed=7))  # the audited data changed
    _cheap_audit(out, run.path)
    assert all(e["status"] == "done" and "data" in e["recomputed"] for e in _log(out).values())

    monkeypatch.setattr(attnaudit, "__version__", "0.0.0-other")
    _cheap_audit(out, run.path)
    assert all(e["status"] == "done" and e["recomputed"] for e in _log(out).values())
    stamp = Result.load(out / "results" / "permutation.json").meta["fingerprint"]
    assert {d["path"] for d in stamp["data"]} == {str(tmp_path / "train.csv"), str(tmp_path / "test.csv")}
    assert stamp["test"] == "permutation" and stamp["version"] == "0.0.0-other"


def test_stray_temporary_files_are_removed_on_the_next_start(tmp_path: Path) -> None:
    run = _train(tmp_path)
    assert run.path is not None
    out = tmp_path / "audit"
    stray = [
        out / ".summary.csv.k2j4h5g6.tmp",
        out / "results" / ".importance.json.abcd1234.tmp",
        out / "subruns" / "uniform" / "seed-1" / ".metrics.json.x_y0z9w8.tmp",
    ]
    foreign = [out / "results" / "notes.tmp", out / "results" / ".x.tmp", out / "results" / "a.json.abcd1234.tmp"]
    for path in stray + foreign:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{")
    _cheap_audit(out, run.path)
    assert [p for p in stray if p.exists()] == [] and all(p.exists() for p in foreign)

    results = tmp_path / "alone"
    left = results / ".permutation.csv.q1w2e3r4.tmp"
    results.mkdir()
    left.write_text("x")
    run_test("permutation", run.path, out=results, limit=LIMIT, plot=False, permutations=2)
    assert not left.exists() and (results / "permutation.json").exists()

    killed = [run.path / ".metrics.json.zz11yy22.tmp", run.path / ".partial" / "checkpoint" / ".state.json.aa33bb44.tmp"]
    for path in killed:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{")
    _train(tmp_path)  # already trained: loads it, after clearing what a killed training left
    assert [p for p in killed if p.exists()] == []


@pytest.mark.parametrize("model", ["bilstm", "transformer"])
def test_an_audit_never_writes_into_the_run_it_reads(model: str, tmp_path: Path) -> None:
    run = _train(tmp_path, model)
    assert run.path is not None
    tests = ["probe"] if model == "transformer" else ["uniform", "seeds", "diagnostic", "global-adversary"]
    if model == "bilstm":  # sub-runs an earlier `attnaudit run` trained beside the run: reused, not retrained
        run_test("uniform", run.path, limit=LIMIT, plot=False, **TRAINING["uniform"])
        run_test("seeds", run.path, limit=LIMIT, plot=False, **TRAINING["seeds"])
    before = _tree(run.path)
    out = tmp_path / "audit"
    result = audit(out, run=run.path, only=tests, limit=LIMIT, test_options={t: TRAINING[t] for t in tests}, figures=False)
    assert result.ok and set(result.results) == set(tests), (result.failed, result.skipped)
    assert _tree(run.path) == before  # byte-identical, no file added or removed
    trained_here = {str(p.parent.relative_to(out / "subruns")) for p in (out / "subruns").rglob("metrics.json")}
    if model == "transformer":
        assert {"probe/original-frozen-seed-1", "probe/adversary-1-frozen-seed-1"} <= trained_here
        return
    assert {"seeds/seed-1", "diagnostic/learned-seed-1", "global-adversary/lambda-1-seed-0"} <= trained_here
    assert not (out / "subruns" / "uniform").exists()  # the finished one under the run is read in place
    for test, table in (("uniform", "scores"), ("seeds", "seeds")):
        assert [r["trained_now"] for r in result.results[test].tables[table] if "trained_now" in r] == [False]
    points = {(p["kind"], p["name"]) for p in result.results["global-adversary"].tables["reference_points"]}
    assert points == {("seed", "seed-1"), ("uniform", "seed-1")}

    again = tmp_path / "alone"  # attnaudit run TEST RUN --out DIR: the same, for one test
    run_test("uniform", run.path, out=again, limit=LIMIT, plot=False, epochs=1, seeds=[2])
    assert (again / "subruns" / "uniform" / "seed-2" / "metrics.json").exists()
    assert _tree(run.path) == before
