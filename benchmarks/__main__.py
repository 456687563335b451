"""``python -m benchmarks`` (``make bench``): run every ``benchmarks/bench_*.py``, then summarise.

Each benchmark's ``main()`` runs in its own interpreter, one after the other, so a failing or
crashing one does not stop the rest (and they do not compete for the CPU). Each times ours
and the peer in interleaved rounds (:func:`benchmarks.common.time_interleaved`). Afterwards a
table of ``benchmarks/results/*.json`` (name, ratio = peer time / our time as median
(min–max) over the rounds, agree) is printed, with this run's status per benchmark, and the
statuses and wall times are written to ``benchmarks/results/bench_runs.json``. Exit code 1
when any benchmark failed. ``python -m benchmarks.table`` then writes the README table.

Usage: ``python -m benchmarks [NAME ...] [--data-dir DIR] [--timeout SECONDS]`` where NAME is
``flow`` or ``bench_flow``; the data directory reaches the benchmarks as ``$ATTNAUDIT_DATA``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.common import COMMAND_ENV, RESULTS, ROOT, ratio_span, write_result

RUNNER_RESULT = "bench_runs"
PRODUCER = {"loo": "bench_importance", "gradient": "bench_importance", "llm": "bench_llm_scale"}  # result files named after no benchmark


def discover() -> list[str]:
    """Module names of the benchmarks (``bench_*.py``), sorted."""
    return sorted(path.stem for path in (ROOT / "benchmarks").glob("bench_*.py"))


def run_benchmark(name: str, timeout: float | None, env: dict[str, str]) -> dict[str, Any]:
    """``benchmarks.<name>.main()`` in a fresh interpreter from the repo root; its output is shown live."""
    start = time.perf_counter()
    command = [sys.executable, "-m", f"benchmarks.{name}"]
    try:
        code = subprocess.run(command, check=False, cwd=ROOT, env=env, timeout=timeout).returncode
        outcome = "ok" if code == 0 else f"failed (exit {code})"
    except subprocess.TimeoutExpired:
        outcome = f"failed (timeout after {timeout:g} s)"
    return {"benchmark": name, "status": outcome, "seconds": round(time.perf_counter() - start, 1)}


def _cell(value: Any) -> str:
    if isinstance(value, dict) and {"min", "median", "max"} <= value.keys():
        return ratio_span(value)
    if isinstance(value, float):
        return f"{value:.3g}"
    return "-" if value is None else str(value)


def summary_rows(statuses: dict[str, str]) -> list[dict[str, str]]:
    """One row per ``results/*.json`` (this runner's own file left out): name, ratio, agree, this run."""
    rows = []
    for path in sorted(RESULTS.glob("*.json")):
        if path.stem == RUNNER_RESULT:
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            rows.append({"file": path.name, "name": "-", "ratio": "-", "agree": "-", "this run": f"unreadable: {exc}"})
            continue
        if not isinstance(data, dict):
            data = {}
        rows.append(
            {
                "file": path.name,
                "name": _cell(data.get("name")),
                "ratio": _cell((data.get("timing") or {}).get("ratio", data.get("ratio"))),
                "agree": _cell(data.get("agree")),
                "this run": statuses.get(PRODUCER.get(path.stem.split("_")[0], f"bench_{path.stem}"), ""),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help="benchmarks to run (default: all), e.g. flow or bench_flow")
    parser.add_argument("--data-dir", default=os.environ.get("ATTNAUDIT_DATA"), help="real data (default $ATTNAUDIT_DATA)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds allowed per benchmark")
    args = parser.parse_args(argv)
    available = discover()
    wanted = [n if n.startswith("bench_") else f"bench_{n}" for n in args.names] or available
    unknown = [n for n in wanted if n not in available]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; available: {', '.join(available)}")
    env = {**os.environ, **({"ATTNAUDIT_DATA": str(args.data_dir)} if args.data_dir else {})}
    env[COMMAND_ENV] = " ".join(["python -m benchmarks", *(argv if argv is not None else sys.argv[1:])])
    console = Console()
    runs = []
    for number, name in enumerate(wanted, 1):
        console.rule(f"[{number}/{len(wanted)}] {name}")
        runs.append(run_benchmark(name, args.timeout, env))
    statuses = {run["benchmark"]: run["status"] for run in runs}

    table = Table(title="benchmarks/results")
    for column in ("file", "name", "ratio", "agree", "this run"):
        table.add_column(column)
    for row in summary_rows(statuses):
        table.add_row(*row.values())
    console.print(table)
    for run in runs:
        console.print(f"{run['benchmark']}: {run['status']} in {run['seconds']:.0f} s")
    write_result(RUNNER_RESULT, {"runs": runs, "data_dir": args.data_dir})
    return 1 if any(run["status"] != "ok" for run in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
