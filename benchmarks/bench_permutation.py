"""Permutation test: batched encode-once/decode-many against a per-instance full-model loop.

Model: a BiLSTM + additive (tanh) attention classifier with the Jain & Wallace sizes
(300-d embeddings, 128 hidden per direction), trained for 2 epochs on the synthetic task
(``benchmarks/runs/bench-bilstm-synthetic``; reused when already trained). Inputs: the
first ``--instances`` test instances, ``--permutations`` permutations each, seed 0.

* ours: :func:`attnaudit.experiments.permutation.permute_batch` over batches of 32 — one
  full forward per instance, then all permutations through a few large ``decode`` calls;
* peer: :func:`attnaudit.experiments.permutation.permutation_loop` — one instance at a time,
  ``model(batch_of_one, [Intervention(...)])`` (the FULL model) per permutation.

Both draw identical permutations, so the output changes must agree (to 1e-5). They are timed
in ``--repeats`` interleaved rounds (:func:`benchmarks.common.time_interleaved`); the ratio is
taken per round. Cost is also given in forward-pass
equivalents: a decode row (weights given) costs ``decode_fraction`` of a full forward (measured).
Writes ``benchmarks/results/permutation.json``.

Run: ``.venv/bin/python -m benchmarks.bench_permutation [--instances 50] [--repeats 5]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnaudit.experiments.permutation import permutation_loop, permute_batch  # noqa: E402
from attnaudit.models.interface import Intervention  # noqa: E402
from attnaudit.progress import set_quiet  # noqa: E402
from attnaudit.run import Run  # noqa: E402
from attnaudit.training.trainer import train  # noqa: E402
from benchmarks.common import (  # noqa: E402
    REPEATS,
    RUNS,
    headline,
    ratio_span,
    time_interleaved,
    write_result,
)

TOLERANCE = 1e-5
BATCH = 32


def decode_fraction(run: Run, examples: list, repeats: int = REPEATS) -> float:
    """Time of ``decode`` (attention + output) relative to a full forward pass, same batch (median per round).

    The decode is given the attention weights, as every permutation and adversary is (the model's
    own scores are then not computed)."""
    batch = run.collate(examples).to(run.device)
    model = run.model
    with torch.no_grad():
        cache = model.encode(batch)
        layer = model.explained_layer % model.num_attention_layers
        given = [Intervention(layer=layer, weights=model.decode(cache).trace[layer - cache.layer].weights)]
        timing, _ = time_interleaved({"decode": lambda: model.decode(cache, given), "full": lambda: model(batch)}, repeats,
                                     ratios={"fraction": ("decode", "full")})
    return timing["fraction"]["median"]


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", type=int, default=50)
    parser.add_argument("--permutations", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=REPEATS, help="interleaved timed rounds")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    set_quiet(True)
    wall = time.perf_counter()

    start = time.perf_counter()
    run = train("synthetic", "bilstm", RUNS / "bench-bilstm-synthetic", epochs=2, seed=0, quiet_eval=True)
    train_s = time.perf_counter() - start
    run.model.eval()
    examples = run.examples("test", args.instances)
    layers = [run.model.explained_layer]
    n, p = len(examples), args.permutations

    def ours() -> np.ndarray:
        chunks = []
        for i, batch in enumerate(run.batches(examples, BATCH)):
            chunks.append(permute_batch(run.model, batch, layers, p, 0, range(i * BATCH, i * BATCH + len(batch))).changes)
        return torch.cat(chunks).numpy()

    timing, out = time_interleaved(
        {"ours": ours, "peer": lambda: permutation_loop(run, examples, layers, p, 0)}, args.repeats, warmup=("ours",)
    )
    ours_out, peer_out = out["ours"], out["peer"]
    max_diff = float(np.abs(ours_out - peer_out).max())
    fraction = decode_fraction(run, examples[:BATCH])
    result = {
        **headline(timing),
        "agree": max_diff <= TOLERANCE,
        "max_abs_diff": max_diff,
        "tolerance": TOLERANCE,
        "timing": timing,
        "ours": "permute_batch: one full forward per instance, all permutations through batched decode calls",
        "peer": "permutation_loop: per instance, the full model rerun for every permutation",
        "model": "bilstm + tanh attention, embed 300, hidden 128/direction, trained 2 epochs on the synthetic task",
        "model_test_accuracy": read_accuracy(run),
        "instances": n,
        "permutations": p,
        "batch_size": BATCH,
        "threads": args.threads,
        "forward_pass_equivalents": {
            "decode_fraction": fraction,
            "ours": n + n * p * fraction,
            "peer": n * (p + 1),
            "minimum": n + n * p * fraction,
            "explanation": "each instance needs its original output (1 full forward) and every permutation needs "
            "attention + output rerun (a decode, `decode_fraction` of a forward); ours does exactly that, the loop "
            "reruns the encoder for every permutation",
        },
        "train_s": train_s,
        "wall_s": time.perf_counter() - wall,
    }
    write_result("permutation", result)
    return result


def read_accuracy(run: Run) -> float | None:
    """Test accuracy recorded by ``train`` (None if absent)."""
    from attnaudit.io import read_json

    path = Path(run.path) / "metrics.json" if run.path else None
    return read_json(path)["test"].get("accuracy") if path and path.exists() else None


if __name__ == "__main__":
    out = main()
    print(
        f"permutation: ours {out['ours_s']:.3f}s, loop {out['peer_s']:.2f}s, ratio {ratio_span(out['timing']['ratio'])}, "
        f"agree={out['agree']} (max |diff| {out['max_abs_diff']:.1e})"
    )
