"""Ray at the edges (issue #47 items 2, 3 and 7): Ray's logging follows ``--quiet``, a sweep on Ray stops on Ctrl-C
within seconds in one line and resumes, and a local Ray starts no more workers than the machine has cores.

Each test starts a local Ray cluster in a fresh process (Ray's start is ~15 s of wall time on the 2-core machine).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from attnaudit.run import Run

from .helpers import CLI, synthetic_rows, write_table

pytest.importorskip("ray")

SWEEP = """\
grid:
  tasks: ['csv:{csv}']
  models: [bilstm, average]
  seeds: [0]
train: {{epochs: {epochs}, embed_dim: 8, hidden_dim: 8, batch_size: 16, patience: 1000}}
audit:
  only: [importance]
  limit: 4
  set:
    importance: {{methods: [gradient]}}
"""


def _start(words: list[str], cwd: Path) -> subprocess.Popen[str]:
    """``attnaudit WORDS`` in its own process group, as a terminal's foreground job (Ctrl-C reaches all of it)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("ATTNAUDIT_DATA", None)
    return subprocess.Popen([*CLI, *words], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env,
                            start_new_session=True, preexec_fn=_ctrl_c_as_in_a_terminal)


def _ctrl_c_as_in_a_terminal() -> None:
    """SIGINT's default action in the child, as a terminal's foreground job has it: a test run started in the background
    of a shell without job control inherits SIGINT ignored, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _left(group: int) -> list[str]:
    """The live processes of a process group (zombies hold nothing)."""
    found = subprocess.run(["ps", "-o", "stat=,args=", "-g", str(group)], capture_output=True, text=True).stdout.splitlines()
    return [line for line in found if not line.strip().startswith("Z")]


@pytest.mark.slow  # a local Ray's start in a fresh process: ~20 CPU-s (make test checks the logging level without Ray, below)
def test_an_audit_on_ray_is_silent_under_quiet(trained: Run, tmp_path: Path) -> None:
    """No Ray INFO or WARNING line ("Started a local Ray instance", its token notice) under --quiet: stderr is empty."""
    process = _start(["audit", "--run", str(trained.path), "--engine", "ray", "--only", "importance", "--limit", "4",
                      "--set", "importance.methods=gradient", "--no-figures", "--out", str(tmp_path / "out"), "--quiet"], tmp_path)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0 and err == "", err
    assert (tmp_path / "out" / "audit.json").is_file()


@pytest.mark.slow  # two local Ray starts and a sweep's training (~1 minute of wall time on the 2-core machine)
def test_a_sweep_on_ray_stops_on_ctrl_c_in_one_line_and_resumes(tmp_path: Path) -> None:
    """Ctrl-C while both jobs train on Ray: one line, exit 130 within seconds, no process of the sweep left (Ray's
    included), the stopped job not recorded as finished; the same command then finishes every job, silently under --quiet."""
    write_table(tmp_path / "tiny.csv", synthetic_rows(160))
    config = tmp_path / "sweep.yaml"
    config.write_text(SWEEP.format(csv=tmp_path / "tiny.csv", epochs=400), encoding="utf-8")
    out = tmp_path / "out"
    words = ["sweep", str(config), "--engine", "ray", "--workers", "2", "--out", str(out), "--quiet"]
    process = _start(words, tmp_path)
    deadline = time.monotonic() + 240
    while len({p.relative_to(out).parts[0] for p in out.rglob("config.json")}) < 2 and process.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.2)  # both jobs are training (their runs are being built in run/.partial)
    assert process.poll() is None, process.communicate()[1]
    os.killpg(process.pid, signal.SIGINT)
    start = time.monotonic()
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130 and time.monotonic() - start < 30, err
    assert [line for line in err.splitlines() if line.strip()] == ["error: interrupted (resume with the same command)"], err
    time.sleep(2)
    assert _left(process.pid) == []
    assert len(list(out.glob("*/job.json"))) < 2  # the BiLSTM's 400 epochs were stopped (the average's may have ended)

    again = _start(words, tmp_path)
    _, err = again.communicate(timeout=900)
    assert again.returncode == 0 and err == "", err
    assert pd.read_csv(out / "sweep.csv")["status"].tolist() == ["done", "done"]


def test_a_local_ray_starts_no_more_workers_than_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's local Ray: ``num_cpus`` (Ray prestarts that many workers) and Ray's soft limit on worker processes are
    the usable cores (the process's affinity, not the machine's count), or ``--workers`` when fewer; Ray's own logging
    is ERROR under --quiet (checked without starting Ray)."""
    import logging

    from attnaudit import cluster
    from attnaudit.progress import is_quiet, set_quiet

    calls: list[dict[str, Any]] = []

    class FakeRay:
        def is_initialized(self) -> bool:
            return False

        def init(self, **kwargs: Any) -> None:
            calls.append(kwargs)

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})  # three usable cores (of more, maybe)
    previous = is_quiet()
    try:
        set_quiet(True)
        assert cluster.connect(FakeRay(), None, None) and cluster.connect(FakeRay(), None, 2)
        set_quiet(False)
        cluster.connect(FakeRay(), None, 1)
    finally:
        set_quiet(previous)
    assert [(c["num_cpus"], c["_system_config"]["num_workers_soft_limit"]) for c in calls] == [(3, 3), (2, 2), (1, 1)]
    assert [c["logging_level"] for c in calls] == [logging.ERROR, logging.ERROR, logging.INFO]
    assert all(c["log_to_driver"] is False and c["include_dashboard"] is False for c in calls)


def test_waiting_on_ray_lets_ctrl_c_through_within_a_second() -> None:
    """Every wait on Ray tasks (the sweep's jobs, the audit's shards) blocks at most :data:`cluster.WAIT_SECONDS` at a
    time: Ray's wait holds the main thread where Python cannot raise KeyboardInterrupt (a Ray sweep ignored Ctrl-C
    until its running job ended)."""
    from attnaudit import cluster

    timeouts: list[float | None] = []

    class SlowRay:
        def wait(self, refs: list[str], num_returns: int = 1, timeout: float | None = None) -> tuple[list[str], list[str]]:
            timeouts.append(timeout)
            return (refs[:1], refs[1:]) if len(timeouts) == 3 else ([], refs)

    assert cluster.wait_one(SlowRay(), ["a", "b"]) == ["a"]
    assert timeouts == [cluster.WAIT_SECONDS] * 3 and cluster.WAIT_SECONDS <= 1


def test_a_failed_task_is_reported_by_its_own_exception_not_rays_header() -> None:
    """A task's exception reaches the driver wrapped in ``RayTaskError``, whose message starts with Ray's header
    (``ray::task() (pid=…)``); the one line logged is the task's own message."""
    from ray.exceptions import RayTaskError

    from attnaudit.cluster import task_error
    from attnaudit.errors import AttnAuditError, error_line

    cause = AttnAuditError("runs/seed-1/unmasked is in use by another attnaudit process (pid 7)")
    wrapped = RayTaskError("roar_task", "Traceback (most recent call last):\n  ...", cause).as_instanceof_cause()
    assert "(pid=" in error_line(wrapped) and "in use" not in error_line(wrapped)  # what was logged before: Ray's header
    assert error_line(task_error(wrapped)) == "runs/seed-1/unmasked is in use by another attnaudit process (pid 7)"
    crashed = RuntimeError("the worker died")
    assert task_error(crashed) is crashed
