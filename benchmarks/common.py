"""Shared bits of the benchmark and reproduction scripts: provenance, timing and result files.

Every speed benchmark times its implementations with :func:`time_interleaved` (``≥ 5`` rounds,
ours and the peer's runs interleaved so that load changes on a shared machine hit both alike)
and stores the returned record under ``"timing"``; :mod:`benchmarks.table` turns those records
into the README table. A claim is the median with its range (min–max over the rounds).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from attnaudit.io import atomic_write_json

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
RUNS = ROOT / "benchmarks" / "runs"
REPEATS = 5  # default rounds of every benchmark (fewer make no claim)
# Set by ``python -m benchmarks`` for the benchmarks it starts, so each result names that command.
COMMAND_ENV = "ATTNAUDIT_BENCH_COMMAND"
DEFAULT_RATIOS = {"ratio": ("peer", "ours")}


def commit() -> str:
    """The current commit (with ``-dirty`` when tracked files other than results changed), or ``uncommitted``.

    ``benchmarks/results/`` is left out of the check: a benchmark run rewrites it as it goes.
    """
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results"],
                               check=False, cwd=ROOT, capture_output=True, text=True)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "uncommitted"


def machine() -> dict[str, Any]:
    """What the timings depend on: cores (all / usable by this process), torch threads and version, date."""
    import torch

    return {
        "cpu_count": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def add_limit_order(parser: Any) -> None:
    """``--limit-order``: how a reproduction's ``--limit`` chooses its sentences (``first`` repeats the figures
    measured before ``--limit`` became a sample stratified by label)."""
    parser.add_argument("--limit-order", default="stratified", choices=("stratified", "first"),
                        help="stratified (a seeded sample, each label keeping its share) or first (the first N)")


def _relative(word: str) -> str:
    """A command-line word with this checkout's absolute path made relative to it (no machine paths in results)."""
    path = Path(word)
    if path.is_absolute() and path.is_relative_to(ROOT):
        return str(path.relative_to(ROOT))
    return word


THREAD_ENVIRONMENT = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS", "KMP_BLOCKTIME", "KMP_AFFINITY")
"""Environment variables that change how torch's CPU threads run (``OMP_WAIT_POLICY=PASSIVE`` alone moved the ferret
comparison from 1.71x to 1.85x: ferret's many small operations wait longer for sleeping threads): stored with every result where set."""


def provenance() -> dict[str, Any]:
    """Command line, the thread environment (:data:`THREAD_ENVIRONMENT`, where set), commit, cores, load average
    (1, 5, 15 min, when the result is written), platform and machine, stored with every result."""
    return {
        "command": os.environ.get(COMMAND_ENV) or " ".join([Path(sys.executable).name, *map(_relative, sys.argv)]),
        "environment": {name: os.environ[name] for name in THREAD_ENVIRONMENT if name in os.environ},
        "commit": commit(),
        "cores": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
        "python": platform.python_version(),
        "machine": machine(),
    }


def stats(values: Sequence[float]) -> dict[str, Any]:
    """``min`` / ``median`` / ``max`` of ``values``, and the values themselves (``runs``)."""
    if not values:
        raise ValueError("no values to summarise")
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "runs": list(values)}


def pair_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """``numerators[i] / denominators[i]`` per round: a ratio of two runs timed side by side."""
    if len(numerators) != len(denominators):
        raise ValueError(f"{len(numerators)} numerators for {len(denominators)} denominators")
    return [n / d for n, d in zip(numerators, denominators)]


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else []


def matmul_rate(repeats: int = 20, size: int = 2048) -> float:
    """GFLOP/s of a ``size``-square float32 matrix product on the current threads (the median of ``repeats``):
    the arithmetic ceiling a profile sets a measured rate beside."""
    import torch  # here: the table scripts import this module and need no torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * size**3 / stats(times)["median"] / 1e9


def time_interleaved(
    fns: dict[str, Callable[[], Any]],
    repeats: int,
    ratios: dict[str, tuple[str, str]] | None = None,
    warmup: Iterable[str] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Time every function once per round for ``repeats`` rounds; the record and each last output.

    Rounds alternate the order (``a, b`` then ``b, a``) so neither side always runs first.
    ``ratios`` maps a name to ``(numerator, denominator)`` function names (default
    ``ratio = peer / ours``); each ratio is taken per round, then summarised. The record holds
    :func:`stats` of every time (``seconds``) and ratio, the repeats, and the 1/5/15-minute
    load average before and after the timed rounds. The functions named in ``warmup`` (default:
    all) are called once first, untimed, to pay for allocator and kernel setup.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, not {repeats}")
    ratios = DEFAULT_RATIOS if ratios is None else ratios
    load_before = _load()
    outputs: dict[str, Any] = {}
    for name in fns if warmup is None else warmup:
        outputs[name] = fns[name]()
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for round_ in range(repeats):
        for name in names if round_ % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            outputs[name] = fns[name]()
            times[name].append(time.perf_counter() - start)
    record = {
        "repeats": repeats,
        "order": "interleaved: one run of each per round, order alternating between rounds",
        "seconds": {name: stats(values) for name, values in times.items()},
        **{key: stats(pair_ratios(times[top], times[bottom])) for key, (top, bottom) in ratios.items()},
        "load_average_before": load_before,
        "load_average_after": _load(),
    }
    return record, outputs


def headline(timing: dict[str, Any], ours: str = "ours", peer: str = "peer") -> dict[str, float]:
    """The medians a result file shows at top level: ``ratio``, ``ours_s``, ``peer_s``."""
    return {
        "ratio": timing["ratio"]["median"],
        "ours_s": timing["seconds"][ours]["median"],
        "peer_s": timing["seconds"][peer]["median"],
    }


def span(stat: dict[str, Any], fmt: str = ".3g", unit: str = "") -> str:
    """``median (min–max)`` of a :func:`stats` record, e.g. ``2.5× (1.9–2.8×)``."""
    return f"{stat['median']:{fmt}}{unit} ({stat['min']:{fmt}}–{stat['max']:{fmt}}{unit})"


def ratio_span(stat: dict[str, Any]) -> str:
    """A ratio's :func:`span`: two decimals below 1, one below 10, whole numbers above."""
    return span(stat, ".2f" if stat["max"] < 1 else ".1f" if stat["max"] < 10 else ".0f", "×")


def relative_paths(value: Any) -> Any:
    """``value`` (JSON: dicts, lists, strings, numbers) with every string that is an absolute path inside this
    checkout made relative to it, as :func:`_relative` does for command-line words."""
    if isinstance(value, dict):
        return {key: relative_paths(item) for key, item in value.items()}
    if isinstance(value, list):
        return [relative_paths(item) for item in value]
    return _relative(value) if isinstance(value, str) else value


def write_result(name: str, payload: dict[str, Any], indent: int | None = 2) -> Path:
    """Write ``benchmarks/results/<name>.json`` atomically with provenance; paths inside the checkout relative to it;
    ``indent`` None writes one line (a large file, such as a ledger)."""
    return atomic_write_json(RESULTS / f"{name}.json", relative_paths({"name": name, **payload, **provenance()}), indent)


class PeerWorker:
    """A peer's persistent worker process, run by its own venv's ``python`` (``script --serve``, ``OMP_NUM_THREADS``
    = ``threads``): one JSON request per line on its stdin, one answer per line on its stdout; a failed or ended
    worker raises ``error`` naming ``name``."""

    def __init__(self, python: Path, script: Path, threads: int = 1, name: str = "peer", error: type[BaseException] = RuntimeError) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        self.proc = subprocess.Popen([str(python), str(script), "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
        self.threads, self.name, self.error = threads, name, error

    def ask(self, **request: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise self.error(f"the {self.name} worker ended (exit {self.proc.poll()}) on {request.get('op')}")
        answer = json.loads(line)
        if not answer.get("ok"):
            raise self.error(f"{self.name} worker: {answer.get('error')}")
        return dict(answer)

    def close(self) -> None:
        try:
            self.ask(op="quit")
        except (self.error, BrokenPipeError, ValueError):
            pass
        self.proc.wait(timeout=30)
