"""Reproduce Jain & Wallace (2019)'s attention-vs-importance correlations on SST (BiLSTM).

Trains ``train("sst", "bilstm", ...)`` in the J&W setting (additive tanh attention, 300-d
embeddings, 128 hidden units, Adam 1e-3, weight decay 1e-5; the trainer's early stopping
on dev accuracy) into ``benchmarks/runs/jw-sst-bilstm`` (gitignored; reused when already
trained), or takes an existing run with ``--run``; then runs the ``importance`` test on the
SST test split and writes ``benchmarks/results/jw_importance.json`` with our figures beside
J&W's and the wall time. Slow (minutes on one core).
Run: ``.venv/bin/python benchmarks/reproduce_jw_importance.py [--data-dir ../shared/data] [--run RUN]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from attnaudit.experiments.base import run_test
from attnaudit.experiments.importance import PUBLISHED
from attnaudit.io import atomic_write_json, read_json
from attnaudit.run import load_run
from attnaudit.training.trainer import train

HERE = Path(__file__).resolve().parent
RESULT = HERE / "results" / "jw_importance.json"
DEFAULT_RUN = HERE / "runs" / "jw-sst-bilstm"


def _commit() -> str:
    """The checked-out commit, or "uncommitted" outside a repository or before the first commit."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "uncommitted"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_data = os.environ.get("ATTNAUDIT_DATA", str(HERE.parent.parent / "shared" / "data"))
    parser.add_argument("--data-dir", type=Path, default=Path(default_data), help="real data directory")
    parser.add_argument("--run", type=Path, default=None, help="use this trained run instead of training one")
    parser.add_argument("--out", type=Path, default=DEFAULT_RUN, help="run directory to train into")
    parser.add_argument("--epochs", type=int, default=10, help="maximum training epochs (early stopping on dev)")
    parser.add_argument("--seed", type=int, default=0, help="training seed")
    parser.add_argument("--vectors", default="minilm", help="word vectors for training (J&W used pretrained ones)")
    parser.add_argument("--methods", default="gradient,loo", help="importance methods (comma-separated)")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    if args.run is not None:
        run = load_run(args.run, data_dir=args.data_dir)
        trained_here = False
    else:
        run = train(
            "sst", "bilstm", args.out, data_dir=args.data_dir, scorer="tanh", attention="softmax",
            epochs=args.epochs, seed=args.seed, vectors=args.vectors,
        )
        trained_here = True
    train_seconds = time.perf_counter() - start
    metrics = read_json(Path(run.path) / "metrics.json") if run.path and (Path(run.path) / "metrics.json").exists() else {}

    start = time.perf_counter()
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    result = run_test("importance", run, split="test", data_dir=args.data_dir, methods=methods)
    test_seconds = time.perf_counter() - start

    ours = {row["pair"]: {k: row[k] for k in ("mean", "std", "median", "n", "n_nan", "significant", "topk_mean")}
            for row in result.tables["pairs"]}
    comparison = {
        pair: {"ours": ours[pair], "published": values}
        for pair, values in PUBLISHED.items()
        if isinstance(values, dict) and pair in ours
    }
    out = {
        "name": "jw_importance",
        "comparison": comparison,
        "ours": ours,
        "published": PUBLISHED,
        "excluded_short": result.summary["excluded_short"],
        "test_accuracy": metrics.get("test", {}).get("accuracy"),
        "dev_accuracy": metrics.get("dev", {}).get("accuracy"),
        "epochs_trained": metrics.get("epochs"),
        "train_seconds": metrics.get("train_seconds"),
        "run": str(run.path),
        "trained_here": trained_here,
        "setting": {"model": run.info.get("model"), "train": run.info.get("train")},
        "train_or_load_seconds": train_seconds,
        "test_seconds": test_seconds,
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "commit": _commit(),
        "cores": os.cpu_count(),
        "notes": result.meta.get("notes", []),
    }
    atomic_write_json(RESULT, out)
    for pair, row in comparison.items():
        published = ", ".join(f"{k} {v}" for k, v in row["published"].items())
        print(f"{pair:24s} ours {row['ours']['mean']:.3f} ± {row['ours']['std']:.3f} "
              f"(sig {row['ours']['significant']:.2f})   J&W {published}")
    print(f"test accuracy {out['test_accuracy']}; train {train_seconds:.0f}s, test {test_seconds:.0f}s -> {RESULT}")
    return out


if __name__ == "__main__":
    main()
