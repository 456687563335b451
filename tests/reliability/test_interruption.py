"""A killed audit resumes to exactly the results of an uninterrupted one.

The audit is started as a CLI process and killed with SIGKILL as soon as its first result file
appears; every result file visible after the kill must be complete JSON (results are written
atomically), and rerunning the audit must reuse the finished test and end with the same
numbers as an audit that was never interrupted. A truncated result file, as a non-atomic
writer would leave behind, is recomputed rather than trusted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd

from attnaudit.audit import audit
from attnaudit.progress import set_quiet
from attnaudit.run import Run

from .helpers import CLI, comparable

set_quiet(True)
TESTS = ["importance", "permutation", "erasure"]  # the audit's order: importance first
SETTINGS = {"importance": {"methods": ["gradient", "loo"]}, "permutation": {"permutations": 300}, "erasure": {"random_orders": 3}}
LIMIT = 20


def _audit(out: Path, run: Run) -> None:
    audit(out, run=run.path, only=TESTS, limit=LIMIT, seed=0, test_options=SETTINGS)


def _committed(path: Path) -> bool:
    """Whether the audit has stored this result as its own (with the options hash it resumes by).

    ``run_test`` saves the result once before the audit adds its hash and saves again; a kill
    between the two only makes the resumed audit recompute that test, so the test waits for
    the second write to check that a finished test is reused.
    """
    try:
        return "options_hash" in json.loads(path.read_text()).get("meta", {}).get("audit", {})
    except FileNotFoundError:  # a JSONDecodeError would mean a half-written file: let it fail the test
        return False


def _statuses(out: Path) -> dict[str, str]:
    """What the audit did per test (done, cached, ...), from ``OUT/audit.json``."""
    return {entry["test"]: entry["status"] for entry in json.loads((out / "audit.json").read_text())["tests"]}


def _assert_same_results(first: Path, second: Path) -> None:
    for test in TESTS:
        a = comparable(json.loads((first / "results" / f"{test}.json").read_text()), first)
        b = comparable(json.loads((second / "results" / f"{test}.json").read_text()), second)
        assert a == b, test
    pd.testing.assert_frame_equal(pd.read_csv(first / "summary.csv"), pd.read_csv(second / "summary.csv"))


def test_killed_audit_resumes_to_the_uninterrupted_results(trained: Run, tmp_path: Path) -> None:
    full, part = tmp_path / "full", tmp_path / "part"
    _audit(full, trained)

    settings = [f"--set={t}.{k}={','.join(v) if isinstance(v, list) else v}" for t, o in SETTINGS.items() for k, v in o.items()]
    command = [*CLI, "audit", "--run", str(trained.path), "--out", str(part), "--limit", str(LIMIT), "--quiet",
               *(f"--only={t}" for t in TESTS), *settings]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    first = part / "results" / "importance.json"
    deadline = time.monotonic() + 300
    while not _committed(first):
        if proc.poll() is not None:
            raise AssertionError(f"the audit ended before its first result: {proc.stderr.read() if proc.stderr else ''}")
        assert time.monotonic() < deadline, "no result within 300 s"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL

    finished = [t for t in TESTS if (part / "results" / f"{t}.json").exists()]
    assert "importance" in finished and len(finished) < len(TESTS), "killed too late to interrupt anything"
    for path in (part / "results").glob("*.json"):
        json.loads(path.read_text())  # complete, never half-written
    assert not (part / "summary.csv").exists() and not (part / "audit.json").exists()

    _audit(part, trained)
    statuses = _statuses(part)
    assert statuses["importance"] == "cached" and statuses["erasure"] == "done"
    _assert_same_results(full, part)


def test_truncated_or_temporary_result_files_are_not_trusted(trained: Run, tmp_path: Path) -> None:
    full, damaged = tmp_path / "full", tmp_path / "damaged"
    _audit(full, trained)
    (damaged / "results").mkdir(parents=True)
    text = (full / "results" / "importance.json").read_text()
    (damaged / "results" / "importance.json").write_text(text[: len(text) // 2])  # what a non-atomic writer leaves
    (damaged / "results" / ".permutation.json.x1y2.tmp").write_text(text)  # a kill during an atomic write
    _audit(damaged, trained)
    statuses = _statuses(damaged)
    assert statuses == {"importance": "done", "permutation": "done", "erasure": "done"}
    _assert_same_results(full, damaged)


def test_ctrl_c_is_a_failure_with_one_line(trained: Run, tmp_path: Path) -> None:
    """SIGINT (what Ctrl-C sends) mid-audit: exit 130 and ``error: interrupted (resume with the same command)``,
    no summary or report that would look finished, no lock file left; ``cmd && next`` stops."""
    out = tmp_path / "audit"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [*CLI, "audit", "--run", str(trained.path), "--out", str(out), "--only", ",".join(TESTS), "--limit", str(LIMIT), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a shell's background job would ignore it
    )
    deadline = time.monotonic() + 300
    while not (out / "results" / "importance.json").exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 130, err
    assert [line for line in err.splitlines() if line.strip()] == ["error: interrupted (resume with the same command)"], err
    assert not (out / "summary.csv").exists() and not (out / "report.html").exists()
    assert not (out / ".attnaudit.lock").exists()


def test_no_lock_file_outlives_a_command(trained: Run, tmp_path: Path) -> None:
    from .helpers import cli

    done = cli("run", "importance", str(trained.path), "--limit", "4", "--out", tmp_path / "out", "--quiet")
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.rglob(".attnaudit.lock")) and not (trained.path / ".attnaudit.lock").exists()
