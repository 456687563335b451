"""Reproduce the base models of the literature on the real data (slow; not in `make test`).

Usage: .venv/bin/python benchmarks/reproduce_base_models.py --data-dir ../shared/data [--only conll2000,sst]

Each model trains into benchmarks/runs/<name> (resumable: a finished run is loaded, a killed
one resumes), then its scores, the published target and the wall time go to
benchmarks/results/base_models.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks.common` when run as a script

from attnaudit.io import read_json  # noqa: E402
from attnaudit.training.trainer import train  # noqa: E402
from benchmarks.common import RESULTS, RUNS, write_result  # noqa: E402

# name -> (task, model, options, metric split, metric key, target, published, source)
JOBS: dict[str, dict[str, Any]] = {
    "conll2000-transformer": {
        "task": "conll2000", "model": "transformer",
        "options": {"layers": 1, "heads": 4, "d_model": 128, "embed_dim": 128, "d_ff": 256, "epochs": 10, "patience": 10,
                    "lr": 2e-3, "warmup": 200, "clip": 1.0, "batch_size": 32, "features": True,
                    "min_freq": 5, "word_dropout": 0.15},
        "split": "test", "metric": "f1", "target": 0.90, "published": 0.90,
        "source": "sequence-tagging attention study (1-layer 4-head Transformer), test chunk F1",
    },
    "sst-bilstm": {
        "task": "sst", "model": "bilstm",
        "options": {"scorer": "tanh", "epochs": 8, "patience": 3, "vectors": "minilm"},
        "split": "test", "metric": "accuracy", "target": 0.80, "published": 0.808,
        "source": "Jain & Wallace 2019 stored result, BiLSTM + tanh attention, test accuracy "
                  "(they used pretrained vectors; ours are MiniLM's static input embeddings, offline)",
    },
    "sst2-transformer-softmax": {
        "task": "sst2", "model": "transformer",
        "options": {"attention": "softmax", "layers": 2, "heads": 4, "epochs": 2, "patience": 1, "lr": 5e-4, "max_vocab": 20000,
                    "vectors": "minilm"},
        "split": "test", "metric": "accuracy", "target": 0.80, "published": 0.8645,
        "source": "sparse-attention study, softmax Transformer (its own data set); ours: GLUE dev.tsv, never used for selection",
    },
    "sst2-transformer-entmax15": {
        "task": "sst2", "model": "transformer",
        "options": {"attention": "entmax15", "layers": 2, "heads": 4, "epochs": 2, "patience": 1, "lr": 5e-4, "max_vocab": 20000,
                    "vectors": "minilm"},
        "split": "test", "metric": "accuracy", "target": 0.80, "published": 0.8505,
        "source": "sparse-attention study, entmax15 Transformer (its own data set); ours: GLUE dev.tsv, never used for selection",
    },
    "babi1-bilstm": {
        "task": "babi1", "model": "bilstm",
        "options": {"scorer": "tanh", "epochs": 20, "patience": 4, "embed_dim": 50, "hidden_dim": 64},
        "split": "test", "metric": "accuracy", "target": 0.99, "published": 1.00,
        "source": "Jain & Wallace 2019, bAbI task 1 QA attention model, test accuracy",
    },
    "agnews-han": {
        "task": "agnews", "model": "han",
        "options": {"epochs": 10, "patience": 3},
        "split": "test", "metric": "accuracy", "target": None, "published": None,
        "source": "HAN (Yang et al. 2016) on AG News; our split of the 7,600-row test file (train is not available)",
    },
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--only", default=None, help="comma-separated job names")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    names = args.only.split(",") if args.only else list(JOBS)
    out_file = RESULTS / "base_models.json"
    for name in names:
        job = JOBS[name]
        run_dir = RUNS / name
        start = time.perf_counter()
        train(job["task"], job["model"], run_dir, data_dir=args.data_dir, **job["options"])
        wall = time.perf_counter() - start
        metrics = json.loads((run_dir / "metrics.json").read_text())
        score = metrics[job["split"]][job["metric"]]
        row = {
            "task": job["task"],
            "model": job["model"],
            "options": job["options"],
            "split": job["split"],
            "metric": job["metric"],
            "score": score,
            "target": job["target"],
            "meets_target": None if job["target"] is None else bool(score >= job["target"]),
            "published": job["published"],
            "source": job["source"],
            "dev": metrics["dev"],
            "test": metrics["test"],
            "epochs": metrics["epochs"],
            "train_seconds": metrics["train_seconds"],
            "wall_seconds_this_call": wall,
            "notes": metrics.get("notes", []),
        }
        print(f"{name}: {job['split']} {job['metric']} = {score:.4f} (target {job['target']}), "
              f"trained in {metrics['train_seconds']:.0f}s")
        # Re-read just before writing: several jobs may run in parallel processes.
        rows: dict[str, Any] = read_json(out_file)["models"] if out_file.exists() else {}
        write_result("base_models", {"models": {**rows, name: row}})


if __name__ == "__main__":
    main()
