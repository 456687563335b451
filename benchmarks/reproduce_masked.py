"""Erasure verdicts on a plain and a masked fine-tune of the same model (Madsen et al. 2024), side by side.

The scoreboard's ERASER metrics mask a method's top items on the unchanged model; the objection is that masked
inputs are out of distribution for a model that never saw a mask. Masked fine-tuning (``finetune --masking``:
half of each batch masked at a random ratio) makes them in distribution. This script fine-tunes the embedded
MiniLM on the same ``--finetune-limit`` SST-2 training phrases twice, with the same seed and settings as
``benchmarks/reproduce_minilm.py`` (1 epoch, AdamW lr 5e-5, batch 16, 128 wordpieces), once plainly and once
with ``--masking``, then on the first ``--limit`` GLUE-dev sentences of each:

1. ``run faithfulness --mode mask`` (every registered method that applies, or ``--methods``): per method
   comprehensiveness / sufficiency AOPC with bootstrap intervals, and its rank;
2. ``run in-distribution`` (MaSF p-values of inputs with 0, 50, 100 % of their tokens masked, random order and
   ``--masf-methods``): the share of inputs found out of distribution at level 0.05.

It writes ``benchmarks/results/<--name>.json``: both models' test accuracy, both scoreboards, the Kendall τ
between the two method rankings (scipy), and the MaSF shares. Finished runs and results are reused.
Run: ``nice -n 5 .venv/bin/python benchmarks/reproduce_masked.py --data-dir ../shared/data``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from scipy.stats import kendalltau

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks.common` when run as a script

from attnaudit.experiments import run_test  # noqa: E402
from attnaudit.io import read_json  # noqa: E402
from attnaudit.run import Run  # noqa: E402
from attnaudit.training.finetune import finetune  # noqa: E402
from benchmarks.common import RUNS, write_result  # noqa: E402

KEEP = ("method", "aopc_comp", "aopc_comp_low", "aopc_comp_high", "aopc_suff", "aopc_suff_low", "aopc_suff_high")


def tuned(args: argparse.Namespace, masking: bool) -> Run:
    """The plain or masked fine-tune (reused when finished with the same settings)."""
    out = args.runs / f"minilm-sst2-{args.finetune_limit}{'-masked' if masking else '-plain'}"
    return finetune("sst2", out, hf="minilm", epochs=1, lr=5e-5, batch_size=16, limit=args.finetune_limit, seed=0,
                    data_dir=args.data_dir, device="cpu", max_len=128, masking=masking)


def scoreboard(run: Run, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """``run faithfulness --mode mask`` on the first ``--limit`` test sentences: the table and its cost."""
    options: dict[str, Any] = {"methods": args.methods.split(",")} if args.methods else {}
    wall, cpu = time.perf_counter(), time.process_time()
    result = run_test("faithfulness", run, split="test", limit=args.limit, out=out, seed=0, mode="mask",
                      limit_order="first", batch_size=8, **options)
    rows = [{k: row.get(k) for k in KEEP} for row in result.tables["scoreboard"]]
    return {"n": result.summary["n"], "scoreboard": rows, "wall_seconds": time.perf_counter() - wall,
            "cpu_seconds": time.process_time() - cpu, "results": str(out)}


def masf(run: Run, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """``run in-distribution``: the share of inputs out of distribution per masking order and ratio."""
    result = run_test("in-distribution", run, split="test", limit=args.limit, out=out, seed=0, limit_order="first",
                      methods=["random", *[m for m in args.masf_methods.split(",") if m]], ratios=[0.0, 50.0, 100.0],
                      reference=args.reference)
    return {"summary": result.summary, "tables": {k: v for k, v in result.tables.items() if len(v) <= 64}}


def ranking_agreement(plain: list[dict[str, Any]], masked: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Kendall τ-b between the two models' method scores on ``key`` (the methods both scored)."""
    a = {r["method"]: r[key] for r in plain if r.get(key) is not None}
    b = {r["method"]: r[key] for r in masked if r.get(key) is not None}
    common = sorted(set(a) & set(b))
    tau = kendalltau([a[m] for m in common], [b[m] for m in common])
    return {"metric": key, "methods": common, "tau": float(tau.statistic), "p": float(tau.pvalue)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--finetune-limit", type=int, default=4000)
    parser.add_argument("--limit", type=int, default=300, help="GLUE-dev sentences scored (the first N)")
    parser.add_argument("--methods", default="", help="comma-separated methods (default: every one that applies)")
    parser.add_argument("--masf-methods", default="gradient,attention")
    parser.add_argument("--reference", type=int, default=200, help="validation instances MaSF is fitted on")
    parser.add_argument("--runs", type=Path, default=RUNS)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="masked_finetune")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    payload: dict[str, Any] = {"command": "python benchmarks/reproduce_masked.py " + " ".join(sys.argv[1:]),
                               "threads": args.threads, "load_before": list(os.getloadavg()), "models": {}}
    for masking in (False, True):
        name = "masked" if masking else "plain"
        run = tuned(args, masking)
        assert run.path is not None
        metrics = read_json(run.path / "metrics.json")
        payload["models"][name] = {
            "run": str(run.path), "masking": masking, "test_accuracy": metrics.get("test", {}).get("accuracy"),
            "faithfulness": scoreboard(run, args, Path(f"{run.path}-results") / "faithfulness-mask"),
            "in_distribution": masf(run, args, Path(f"{run.path}-results") / "in-distribution"),
        }
        write_result(args.name, payload)
    plain, masked = (payload["models"][n]["faithfulness"]["scoreboard"] for n in ("plain", "masked"))
    payload["ranking_agreement"] = [ranking_agreement(plain, masked, key) for key in ("aopc_comp", "aopc_suff")]
    payload.update(seconds=time.perf_counter() - started, load_after=list(os.getloadavg()))
    print(write_result(args.name, payload))


if __name__ == "__main__":
    main()
