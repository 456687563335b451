"""Training throughput (real tokens per second) of :func:`attnaudit.training.trainer.train`.

Two models of the literature, with the trainer's defaults otherwise:

* the CoNLL-2000 chunker: Transformer tagger, 1 layer, 4 heads (d_model 128);
* Jain & Wallace's SST classifier: BiLSTM (embeddings 300, hidden 128) with tanh attention.

Each is trained for exactly ``--batches`` batches of 32 (one epoch over the first 32 × batches
training sentences, with 32 dev and 32 test sentences) into a fresh folder, ``--runs`` times;
tokens/s = real (non-padding, ≤ max_len) training tokens / the epoch time the trainer records
(which includes scoring the 32 dev sentences). The median run is reported. With no data
directory (``--data-dir`` or ``$ATTNAUDIT_DATA``) the synthetic tagging and classification
tasks stand in, which the result says. One torch thread, CPU. There is no peer: ``ratio``
and ``agree`` do not apply.

Run: ``.venv/bin/python -m benchmarks.bench_training [--data-dir ../shared/data]``
→ ``benchmarks/results/training.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks.common` when run as a script

from attnaudit.data.tasks import load_task  # noqa: E402
from attnaudit.data.types import TaskData  # noqa: E402
from attnaudit.progress import set_quiet  # noqa: E402
from attnaudit.training.trainer import train  # noqa: E402
from benchmarks.common import write_result  # noqa: E402

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


def measure(name: str, data: TaskData, batches: int, runs: int) -> dict[str, Any]:
    """Train ``runs`` times for ``batches`` batches; the median epoch time and tokens/s."""
    setup = SETUPS[name]
    subset = _subset(data, batches)
    tokens = sum(min(len(ex.tokens), MAX_LEN) for ex in subset.train)
    seconds = []
    for run in range(runs):
        with tempfile.TemporaryDirectory() as folder:
            trained = train(subset, setup["model"], Path(folder) / "run", epochs=1, batch_size=BATCH_SIZE, seed=run,
                            device="cpu", quiet_eval=True, **setup["options"])
            seconds.append(json.loads((Path(folder) / "run" / "metrics.json").read_text())["train_seconds"])
    median = statistics.median(seconds)
    config = trained.config
    return {
        "task": data.name,
        "model": setup["model"],
        "size": {"embed_dim": config.embed_dim, "hidden_dim": config.hidden_dim, "d_model": config.d_model,
                 "layers": config.layers, "heads": config.heads},
        "batches": batches,
        "batch_size": BATCH_SIZE,
        "sentences": len(subset.train),
        "tokens": tokens,
        "epoch_seconds": seconds,
        "median_seconds": median,
        "tokens_per_s": tokens / median,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default=os.environ.get("ATTNAUDIT_DATA"), help="real data (default $ATTNAUDIT_DATA)")
    parser.add_argument("--batches", type=int, default=100, help="training batches of 32 per run")
    parser.add_argument("--runs", type=int, default=3, help="runs per model (the median is reported)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    set_quiet(True)
    start = time.perf_counter()
    real = bool(args.data_dir) and Path(args.data_dir).is_dir()
    models = {}
    for name, setup in SETUPS.items():
        data = load_task(setup["task"], data_dir=args.data_dir) if real else load_task(setup["fallback"])
        models[name] = measure(name, data, args.batches, args.runs)
        print(f"{name}: {models[name]['tokens_per_s']:.0f} tokens/s ({models[name]['tokens']} tokens, "
              f"median {models[name]['median_seconds']:.2f} s of {args.runs})")
    result = {
        "data": "real" if real else "synthetic (no data directory)",
        "models": models,
        "threads": torch.get_num_threads(),
        "device": "cpu",
        "wall_seconds": round(time.perf_counter() - start, 1),
    }
    write_result("training", result)
    return result


if __name__ == "__main__":
    main()
