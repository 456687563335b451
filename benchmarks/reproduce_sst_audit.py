"""The SST BiLSTM's audit on 200 test sentences (the results page's "other tests, default protocol" table).

Usage: python benchmarks/reproduce_sst_audit.py --data-dir ../shared/data [--limit 200] [--limit-order stratified]

Trains ``benchmarks/runs/sst-bilstm`` with the config of ``reproduce_base_models.py`` (loaded when it is there), audits
it with Jain & Wallace's and Serrano & Smith's tests (``importance``, ``permutation``, ``erasure``, ``adversarial``)
on ``--limit`` test sentences into ``benchmarks/runs/sst-audit-<order>`` through :func:`attnaudit.audit.audit`, the
function behind ``attnaudit audit``, and writes each test's summary, the sentences it tested and its seconds to
``benchmarks/results/sst_audit_<order>.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks.common` when run as a script

from attnaudit.audit import AuditResult, audit  # noqa: E402
from attnaudit.io import read_json  # noqa: E402
from attnaudit.training.trainer import train  # noqa: E402
from benchmarks.common import RUNS, add_limit_order, write_result  # noqa: E402
from benchmarks.reproduce_base_models import JOBS  # noqa: E402

TESTS = ("importance", "permutation", "erasure", "adversarial")
BASE = "sst-bilstm"


def collect(outcome: AuditResult) -> dict[str, dict[str, Any]]:
    """Each test's headline summary, the subset it tested and its seconds, as the audit stored them; a test that
    failed or was skipped stops the script (the table would be missing a row)."""
    missing = {**outcome.failed, **outcome.skipped}
    if missing:
        raise SystemExit("the audit did not finish: " + "; ".join(f"{k}: {v}" for k, v in missing.items()))
    return {name: {"summary": result.summary, "subset": result.meta["subset"], "seconds": result.meta["seconds"]}
            for name, result in outcome.results.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--limit", type=int, default=200, help="test sentences audited (the table's 200)")
    parser.add_argument("--threads", type=int, default=2)
    add_limit_order(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    job, run = JOBS[BASE], RUNS / BASE
    start = time.perf_counter()
    train(job["task"], job["model"], run, data_dir=args.data_dir, **job["options"])  # loads a finished run
    trained = time.perf_counter() - start
    out = RUNS / f"sst-audit-{args.limit_order}"
    outcome = audit(out, run=run, only=TESTS, limit=args.limit, data_dir=args.data_dir, limit_order=args.limit_order)
    metrics = read_json(run / "metrics.json")
    write_result(f"sst_audit_{args.limit_order}", {
        "run": {"folder": str(run), "options": job["options"], "test_accuracy": metrics["test"]["accuracy"],
                "train_seconds": metrics["train_seconds"], "seconds_this_call": round(trained, 1)},
        "limit": args.limit, "limit_order": args.limit_order, "tests": collect(outcome),
    })


if __name__ == "__main__":
    main()
