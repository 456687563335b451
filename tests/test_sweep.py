"""Sweeps: YAML validation with file:line errors, planning, λ routing, the local pool and Ray engines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pytest

from attnaudit.errors import AttnAuditError, InputError
from attnaudit.experiments.experiment import EXPERIMENTS, Experiment, register
from attnaudit.progress import set_quiet
from attnaudit.sweep import JOB_FILE, load_config, plan, sweep, table_rows

set_quiet(True)
TINY = """\
grid:
  tasks: [csv:tiny.csv]
  models: [bilstm, average]
  seeds: [0, 1]
train: {epochs: 1, embed_dim: 8, hidden_dim: 8, batch_size: 64}
audit:
  only: [importance]
  limit: 4
  set:
    importance: {methods: [gradient]}
"""


def _write(tmp_path: Path, text: str, name: str = "sweep.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("grid:\n  tasks: [synthetic]\n  models: [bilstm, lstm]\n", 3, "unknown model 'lstm'"),
        ("grid:\n  tasks: [synthetic]\n", 1, "missing 'models'"),
        ("grdi:\n  tasks: [synthetic]\n", 1, "unknown key 'grdi'"),
        ("grid:\n  tasks: [synthetic]\n  models: [bilstm]\n  normalisers: [softmax, entmax:0.5]\n", 4, "unknown attention normaliser"),
        ("grid:\n  tasks: [synthetic]\n  models: [bilstm]\n  seeds: [0, 0]\n", 4, "listed twice"),
        ("grid:\n  tasks: [synthetic]\n  models: [bilstm]\n  seeds: [1.5]\n", 4, "integer seed"),
        ("grid:\n  tasks: [synthetic]\n  models: [bilstm]\ntrain:\n  epochs: three\n", 5, "train.epochs: expected int"),
        ("grid:\n  tasks: [synthetic]\n  models: [bilstm]\ntrain:\n  seed: 3\n", 5, "set by the grid"),
        ("grid:\n  tasks: [synthetic]\n  models: [bilstm]\ntrain:\n  epoch: 3\n", 5, "unknown option 'epoch'"),
        ("grid:\n  tasks: [synthetic]\n  models: [bilstm]\naudit:\n  only: [importance, nope]\n", 5, "unknown test 'nope'"),
        ("grid:\n  tasks: [synthetic]\n  models: [bilstm]\naudit:\n  set:\n    permutation: {permutations: many}\n", 6, "expected int"),
        ("grid:\n  tasks: [synthetic]\n  models: [bilstm]\naudit:\n  limit: 0\n", 5, "positive integer"),
        ("grid:\n  tasks: [synthetic]\n  models: [bilstm]\n  models: [cnn]\n", 4, "duplicate key 'models'"),
        ("grid:\n  tasks: [synthetic\n  models: [bilstm]\n", 3, "invalid YAML"),
        ("grid:\n  tasks: [synthetic]\n  models: [bilstm]\n  lambdas: [0.1]\naudit:\n  only: [importance]\n", 4, "lambdas"),
        ("", None, "empty sweep file"),
        ("grid:\n  tasks: [sst2]\n  hf: [minilm, 3]\n", 3, "grid.hf: expected a model name or folder"),
        ("grid:\n  tasks: [sst2]\n  hf: [./no-such-model/]\n", 3, "not a Hugging Face model directory"),
        ("grid:\n  tasks: [sst2]\n  hf: [minilm]\n  prompts: ['Review: text']\n", 4, "{text} exactly once"),
        ("grid:\n  tasks: [sst2]\n  hf: [minilm]\n  verbalizers: [{positive: ' good'}]\n", 4, "at least two label"),
        ("grid:\n  tasks: [sst2]\n  hf: [minilm]\n  verbalizers: ['positive']\n", 4, "cannot read"),
        ("grid:\n  tasks: [sst2]\n  hf: [minilm]\n  dtypes: [float16]\n", 4, "grid.dtypes"),
        ("grid:\n  tasks: [sst2]\n  hf: [minilm]\n  max_lengths: [0]\n", 4, "positive number of tokens"),
        ("grid:\n  tasks: [sst2]\n  models: [bilstm]\n  dtypes: [bfloat16]\n", 4, "applies to grid.hf"),
        ("grid:\n  tasks: [sst2]\n  hf: [minilm]\n  normalisers: [sparsemax]\n", 4, "applies to grid.models"),
        ("grid:\n  tasks: [sst2]\n  hf: [minilm]\ntrain:\n  epochs: 1\n", 4, "train: applies to grid.models"),
        ("grid:\n  tasks: [sst2]\n  hf: [minilm, minilm]\n", 3, "listed twice"),
        ("grid:\n  tasks: [sst2]\n  hf:\n    - minilm\n    - {name: smollm2, promt: 'x {text}'}\n", 5, "unknown key 'promt'"),
        ("grid:\n  tasks: [sst2]\n  hf:\n    - {prompt: 'x {text}'}\n", 4, "missing 'name'"),
        ("grid:\n  tasks: [sst2]\n  hf:\n    - {name: smollm2, prompt: 'x text'}\n", 4, "{text} exactly once"),
        ("grid:\n  tasks: [sst2]\n  hf:\n    - {name: smollm2, prompt: 'x {text}'}\n  prompts: ['y {text}']\n", 4, "keep one"),
    ],
)
def test_invalid_files_fail_with_one_line_naming_file_and_line(tmp_path: Path, text: str, line: int | None, message: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(InputError) as info:
        load_config(path)
    assert info.value.line == line and info.value.path == str(path)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.fixture
def lambda_test():
    """A registered test taking ``lambdas`` (removed afterwards), to check λ routing."""

    @register
    class Takes(Experiment):
        name = "zz-lambdas"
        description = "takes lambdas"

        @dataclass
        class Options:
            lambdas: list[float] = field(default_factory=lambda: [0.0, 1.0])

    yield Takes.name
    EXPERIMENTS.pop(Takes.name)


def test_plan_crosses_the_axes_and_routes_lambda(tmp_path: Path, lambda_test: str) -> None:
    text = (
        "grid:\n  tasks: [synthetic, csv:data/my file.csv]\n  models: [bilstm]\n  seeds: [0, 1]\n  lambdas: [0.01, 1]\n"
        f"audit:\n  only: [importance, {lambda_test}]\n"
    )
    jobs = plan(load_config(_write(tmp_path, text)), tmp_path / "out")
    assert len(jobs) == 2 * 2 * 2
    assert jobs[0].id == "synthetic_bilstm_softmax_s0_l0.01"
    assert jobs[-1].id == "csv-data-my-file.csv_bilstm_softmax_s1_l1"
    assert len({j.id for j in jobs}) == len(jobs) and len({j.digest() for j in jobs}) == len(jobs)
    assert jobs[-1].test_options == {lambda_test: {"lambdas": [1.0]}}  # only the test that takes λ
    assert all(Path(j.out).parent == (tmp_path / "out").resolve() for j in jobs)


def test_table_has_one_row_per_job_with_statistics_and_errors() -> None:
    records = [
        {"id": "a", "params": {"task": "t", "model": "bilstm", "attention": "softmax", "seed": 0}, "status": "done",
         "seconds": 1.0, "summary": {"importance": {"n": 4, "tau_mean": 0.5, "by_class": {"pos": 1}}},
         "rows": [{"test": "importance", "statistic": "tau_mean", "value": 0.5, "published": "", "interpretation": "weak"},
                  {"test": "importance", "statistic": "verdict", "value": "ok", "published": "", "interpretation": ""},
                  {"test": "erasure", "statistic": "skipped", "value": "", "published": "", "interpretation": "why"}]},
        {"id": "b", "params": {"task": "t", "model": "cnn", "attention": "softmax", "seed": 0}, "status": "failed", "error": "boom"},
    ]
    rows = table_rows(records)
    assert rows[0]["importance.n"] == 4 and rows[0]["importance.tau_mean"] == 0.5 and rows[0]["importance.verdict"] == "ok"
    assert rows[0]["importance.by_class"] == '{"pos": 1}' and rows[0]["erasure.skipped"] == "why" and rows[0]["error"] == ""
    assert rows[1]["error"] == "boom" and "importance.n" not in rows[1]


def _tiny_config(tmp_path: Path, **replace: str) -> Path:
    """The tiny grid's YAML, plus ``tiny.csv``: 160 texts of the synthetic task (seconds per job)."""
    from attnaudit.data.synthetic import synthetic_task

    data = synthetic_task("classification", seed=0, n_train=160, n_dev=0, n_test=0)
    pd.DataFrame({"text": [" ".join(ex.tokens) for ex in data.train], "label": [ex.label for ex in data.train]}).to_csv(
        tmp_path / "tiny.csv", index=False
    )
    text = TINY
    for old, new in replace.items():
        text = text.replace(old, new)
    return _write(tmp_path, text)


def test_local_engine_runs_grid_reports_failure_and_skips_finished_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _tiny_config(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "csv-tiny.csv_average_softmax_s1").write_text("a file where the job's folder should go")  # one job must fail
    cli = subprocess.run(
        [sys.executable, "-m", "attnaudit.cli", "sweep", str(config), "--out", str(out), "--workers", "2", "--quiet"],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300,
    )
    assert cli.returncode == 2, cli.stderr
    failed_lines = [line for line in cli.stdout.splitlines() if line.startswith("failed:")]
    assert len(failed_lines) == 1 and "csv-tiny.csv_average_softmax_s1" in failed_lines[0]
    assert cli.stderr.strip().splitlines() == ["error: 1 of 4 sweep job(s) failed (see " + str(out.resolve() / "sweep.csv") + ")"]

    table = pd.read_csv(out / "sweep.csv")
    assert len(table) == 4 and list(table.columns[:4]) == ["job", "task", "model", "attention"]
    assert table["status"].tolist().count("done") == 3
    bad = table[table["status"] == "failed"].iloc[0]
    assert bad["job"] == "csv-tiny.csv_average_softmax_s1" and isinstance(bad["error"], str) and bad["error"]
    done = table[table["status"] == "done"]
    assert done["importance.n"].tolist() == [4, 4, 4]
    assert json.loads((out / "sweep.json").read_text())["failed"] == 1

    stamps = {p.parent.name: p.stat().st_mtime_ns for p in out.glob(f"*/{JOB_FILE}")}
    (out / "csv-tiny.csv_average_softmax_s1").unlink()
    monkeypatch.chdir(tmp_path)  # the task path is relative, as in the file
    again = sweep(config, out=out, workers=1)
    assert again.ok and sorted(again.skipped) == sorted(stamps)
    assert {p.parent.name: p.stat().st_mtime_ns for p in out.glob(f"*/{JOB_FILE}") if p.parent.name in stamps} == stamps
    assert pd.read_csv(out / "sweep.csv")["status"].tolist() == ["done"] * 4


def test_ray_engine_on_a_local_ray_instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ray = pytest.importorskip("ray")
    monkeypatch.chdir(tmp_path)
    # One job is enough to exercise the Ray path; the grid logic is tested on the local engine.
    config = _tiny_config(tmp_path, **{"models: [bilstm, average]": "models: [bilstm]", "seeds: [0, 1]": "seeds: [0]"})
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _system_config={"num_workers_soft_limit": 2})  # at most 2 worker processes
    try:
        result = sweep(config, engine="ray", out=tmp_path / "out")
        assert ray.is_initialized()  # the sweep leaves a Ray it did not start running
    finally:
        ray.shutdown()
    assert result.ok and [job["id"] for job in result.jobs] == ["csv-tiny.csv_bilstm_softmax_s0"]
    assert all((tmp_path / "out" / job["id"] / "summary.csv").exists() for job in result.jobs)
    assert pd.read_csv(tmp_path / "out" / "sweep.csv")["importance.n"].tolist() == [4]


def test_bad_arguments_are_one_line_errors(tmp_path: Path) -> None:
    config = _tiny_config(tmp_path)
    with pytest.raises(AttnAuditError, match="unknown engine"):
        sweep(config, engine="dask", out=tmp_path)
    with pytest.raises(AttnAuditError, match="no output folder"):
        sweep(config)
    with pytest.raises(AttnAuditError, match="--workers"):
        sweep(config, out=tmp_path, workers=0)


def test_ctrl_c_stops_the_pool_in_seconds_with_one_line(tmp_path: Path) -> None:
    """Ctrl-C reaches every process of the terminal's group: the workers leave it to the parent, which ends them at
    once (no worker traceback, no wait on a running job) and exits 130 in one line; no job is recorded as finished."""
    import signal
    import time

    # Jobs that cannot end before the interrupt, however slowly the second worker starts: no early stop
    # (patience) and labels shuffled, so that dev accuracy never reaches 1.0 (training stops at that ceiling).
    config = _tiny_config(tmp_path, **{"epochs: 1": "epochs: 100000, patience: 100000"})
    table = pd.read_csv(tmp_path / "tiny.csv")
    table["label"] = table["label"].sample(frac=1.0, random_state=0).to_numpy()
    table.to_csv(tmp_path / "tiny.csv", index=False)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "attnaudit.cli", "sweep", str(config), "--out", str(out), "--workers", "2", "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env,
                               start_new_session=True,  # its own process group, as a terminal's foreground job
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # not ignored, as in a terminal
    deadline = time.monotonic() + 240
    while len({p.relative_to(out).parts[0] for p in out.rglob("config.json")}) < 2 and process.poll() is None \
            and time.monotonic() < deadline:  # (a run is built in run/.partial until it is whole)
        time.sleep(0.1)  # both workers are training
    assert process.poll() is None, process.communicate()[1]
    os.killpg(process.pid, signal.SIGINT)
    start = time.monotonic()
    _, err = process.communicate(timeout=60)
    assert time.monotonic() - start < 30 and process.returncode == 130, err
    assert [line for line in err.splitlines() if line.strip()] == ["error: interrupted (resume with the same command)"], err
    time.sleep(1)
    group = subprocess.run(["ps", "-o", "stat=,args=", "-g", str(process.pid)], capture_output=True, text=True).stdout.splitlines()
    assert [line for line in group if not line.strip().startswith("Z")] == []  # no worker outlives the sweep (zombies hold nothing)
    assert not list(out.glob("*/job.json"))  # no job looks finished: the same command runs them again
