"""Training throughput (real tokens per second) of :func:`attnaudit.training.trainer.train`.

Two models of the literature, with the trainer's defaults otherwise:

* the CoNLL-2000 chunker: Transformer tagger, 1 layer, 4 heads (d_model 128);
* Jain & Wallace's SST classifier: BiLSTM (embeddings 300, hidden 128) with tanh attention.

Each is trained for exactly ``--batches`` batches of 32 (one epoch over the first 32 × batches
training sentences, with 32 dev and 32 test sentences) into a fresh folder, ``--runs`` times;
tokens/s = real (non-padding, ≤ max_len) training tokens / the epoch time the trainer records
(which includes scoring the 32 dev sentences). The two models' runs are interleaved round by
round (:func:`benchmarks.common.time_interleaved`); min / median / max of tokens/s are reported.
With no data
directory (``--data-dir`` or ``$ATTNAUDIT_DATA``) the synthetic tagging and classification
tasks stand in, which the result says. One torch thread, CPU. There is no peer: ``ratio``
and ``agree`` do not apply.

Run: ``.venv/bin/python -m benchmarks.bench_training [--data-dir ../shared/data] [--batches 50] [--runs 5]``
→ ``benchmarks/results/training.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks.common` when run as a script

from attnaudit.data.tasks import load_task  # noqa: E402
from attnaudit.data.types import TaskData  # noqa: E402
from attnaudit.progress import set_quiet  # noqa: E402
from attnaudit.training.trainer import train  # noqa: E402
from benchmarks.common import REPEATS, span, stats, time_interleaved, write_result  # noqa: E402

BATCH_SIZE = 32
MAX_LEN = 512  # ModelConfig's default: longer sentences are truncated, so their excess is not counted
SETUPS = {
    "conll2000-transformer": {"task": "conll2000", "fallback": "synthetic-tagging", "model": "transformer", "options": {"layers": 1, "heads": 4}},
    "sst-bilstm": {"task": "sst", "fallback": "synthetic", "model": "bilstm", "options": {}},
}


def _subset(data: TaskData, batches: int) -> TaskData:
    """The first ``batches`` × 32 training sentences and 32 dev/test sentences (same label set)."""
    n = batches * BATCH_SIZE
    if len(data.train) < n:
        raise SystemExit(f"{data.name}: {len(data.train)} training sentences, fewer than {batches} batches of {BATCH_SIZE}")
    return TaskData(
        data.name, data.task_type, data.train[:n], data.dev[:BATCH_SIZE], data.test[:BATCH_SIZE], data.labels,
        [*data.notes, f"benchmark subset: first {n} training, {BATCH_SIZE} dev and {BATCH_SIZE} test sentences"],
    )


def trainer(name: str, subset: TaskData, seconds: list[float]) -> Callable[[], Any]:
    """One training run of setup ``name`` on ``subset`` into a fresh folder; appends the recorded epoch time."""
    setup = SETUPS[name]

    def one_run() -> Any:
        with tempfile.TemporaryDirectory() as folder:
            trained = train(subset, setup["model"], Path(folder) / "run", epochs=1, batch_size=BATCH_SIZE,
                            seed=len(seconds), device="cpu", quiet_eval=True, **setup["options"])
            seconds.append(json.loads((Path(folder) / "run" / "metrics.json").read_text())["train_seconds"])
        return trained.config

    return one_run


def describe(name: str, subset: TaskData, config: Any, seconds: list[float]) -> dict[str, Any]:
    """The result row of one setup: sizes, tokens, epoch times and tokens/s (min / median / max)."""
    tokens = sum(min(len(ex.tokens), MAX_LEN) for ex in subset.train)
    return {
        "task": subset.name,
        "model": SETUPS[name]["model"],
        "size": {"embed_dim": config.embed_dim, "hidden_dim": config.hidden_dim, "d_model": config.d_model,
                 "layers": config.layers, "heads": config.heads},
        "batches": len(subset.train) // BATCH_SIZE,
        "batch_size": BATCH_SIZE,
        "sentences": len(subset.train),
        "tokens": tokens,
        "epoch_seconds": stats(seconds),
        "tokens_per_s": stats([tokens / s for s in seconds]),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default=os.environ.get("ATTNAUDIT_DATA"), help="real data (default $ATTNAUDIT_DATA)")
    parser.add_argument("--batches", type=int, default=50, help="training batches of 32 per run")
    parser.add_argument("--runs", type=int, default=REPEATS, help="runs per model, interleaved")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    set_quiet(True)
    start = time.perf_counter()
    real = bool(args.data_dir) and Path(args.data_dir).is_dir()
    subsets = {
        name: _subset(load_task(setup["task"], data_dir=args.data_dir) if real else load_task(setup["fallback"]), args.batches)
        for name, setup in SETUPS.items()
    }
    seconds: dict[str, list[float]] = {name: [] for name in SETUPS}
    timing, configs = time_interleaved(
        {name: trainer(name, subsets[name], seconds[name]) for name in SETUPS}, args.runs, ratios={}, warmup=()
    )
    models = {}
    for name in SETUPS:
        models[name] = describe(name, subsets[name], configs[name], seconds[name])
        print(f"{name}: {span(models[name]['tokens_per_s'], '.0f')} tokens/s ({models[name]['tokens']} tokens, "
              f"{args.runs} runs)")
    result = {
        "data": "real" if real else "synthetic (no data directory)",
        "models": models,
        "threads": torch.get_num_threads(),
        "timing": timing,
        "timing_note": "timing.seconds: wall time of each whole run (set-up included); tokens/s uses the trainer's epoch time",
        "device": "cpu",
        "wall_seconds": round(time.perf_counter() - start, 1),
    }
    write_result("training", result)
    return result


if __name__ == "__main__":
    main()
