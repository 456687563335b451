"""Leave-one-out and gradient importance against their Captum equivalents, side by side.

For each encoder (bilstm, average, cnn, transformer) one model with the family's default
sizes (``attnaudit.training.trainer.FAMILY_DEFAULTS``, randomly initialised: the timing
and the agreement do not depend on training) explains the same 64 sentences:

* ``loo``: :func:`attnaudit.importance.loo_importance` (family shortcuts) vs
  :func:`attnaudit.importance.loo_importance_reference` (Captum ``FeatureAblation``,
  one forward pass per item position) -> ``results/loo_<encoder>.json``;
* ``gradient``: :func:`attnaudit.importance.gradient_importance` vs Captum ``Saliency``
  on the embeddings (signed gradient, attention detached) times the input ->
  ``results/gradient.json``.

Sentences: by default 64 synthetic sentences of 15-25 tokens (SST's test sentences
average ~19 tokens); with ``--data-dir`` the first 64 sentences of Jain & Wallace's SST
test split. Each side is timed ``--repeats`` times; medians are compared. Cost is also given in
forward-pass equivalents: each side's time over the median time of one batched forward pass
of the same model over the same sentences (``forward_pass_equivalents_ours`` / ``_peer``).
Run: ``.venv/bin/python benchmarks/bench_importance.py [--data-dir ../shared/data]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnaudit.data.batching import Collator
from attnaudit.data.readers import read_jw_sst_csv
from attnaudit.data.synthetic import make_classification
from attnaudit.data.types import Batch, Example
from attnaudit.data.vocab import Vocab
from attnaudit.explain.gradient import gradient_importance
from attnaudit.explain.loo import loo_importance, loo_importance_reference
from attnaudit.io import atomic_write_json
from attnaudit.models import ModelConfig, build_model, detach_weights
from attnaudit.run import Run, TaskSpec
from attnaudit.training.trainer import FAMILY_DEFAULTS
from benchmarks.common import commit

RESULTS = Path(__file__).resolve().parent / "results"
ENCODERS = ("bilstm", "average", "cnn", "transformer")
LABELS = ["negative", "positive"]
N_SENTENCES = 64
TOLERANCE = 1e-5


def _median_seconds(fn: Callable[[], torch.Tensor], repeats: int) -> tuple[float, torch.Tensor]:
    """Median wall time of ``repeats`` calls, and the last result."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def sentences(data_dir: Path | None) -> tuple[list[Example], str]:
    """The 64 sentences to explain and a description of them."""
    if data_dir is not None:
        path = data_dir / "sst" / "sst_dataset.csv"
        return read_jw_sst_csv(path)["test"][:N_SENTENCES], f"first {N_SENTENCES} SST test sentences ({path})"
    examples = make_classification(N_SENTENCES, seed=0, min_len=15, max_len=25)
    return examples, f"{N_SENTENCES} synthetic sentences of 15-25 tokens (make_classification, seed 0)"


def make_run(encoder: str, examples: list[Example]) -> tuple[Run, Batch]:
    """A randomly initialised model of the family's default size and the batch to explain."""
    vocab = Vocab.build(ex.tokens for ex in examples)
    sizes = {k: v for k, v in FAMILY_DEFAULTS[encoder].items() if k in ModelConfig.__dataclass_fields__}
    config = ModelConfig(
        model=encoder, task_type="classification", vocab_size=len(vocab), num_labels=len(LABELS), **sizes
    )
    torch.manual_seed(0)
    model = build_model(config).eval()
    collate = Collator(vocab, LABELS, "classification")
    run = Run(model=model, collate=collate, task=TaskSpec(spec="bench", task_type="classification", labels=LABELS))
    return run, collate(examples)


def saliency_gradient(run: Run, batch: Batch) -> torch.Tensor:
    """The peer: Captum ``Saliency`` (signed) on the embeddings with attention detached, times the input."""
    from captum.attr import Saliency

    model = run.model
    with torch.no_grad():
        target = model(batch).probs.argmax(-1)
        embeddings = model.embed(batch)

    def forward(x: torch.Tensor) -> torch.Tensor:
        return model(batch, [detach_weights()], embeddings=x).probs

    grad = Saliency(forward).attribute(embeddings, target=target, abs=False)
    return (grad * embeddings).sum(-1).abs() * batch.mask.to(embeddings.dtype)


def forward_seconds(run: Run, batch: Batch, repeats: int) -> float:
    """Median time of one batched forward pass (no gradient): the unit of forward-pass equivalents."""

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return run.model(batch).logits

    forward()  # warm-up
    return _median_seconds(forward, repeats)[0]


def compare(
    ours: Callable[[], torch.Tensor], peer: Callable[[], torch.Tensor], repeats: int, forward_s: float
) -> dict[str, Any]:
    """Time both, check they agree (NaN where the other is NaN, else within TOLERANCE)."""
    peer()  # warm-up: first calls pay for allocator and kernel setup
    ours()
    ours_s, a = _median_seconds(ours, repeats)
    peer_s, b = _median_seconds(peer, repeats)
    same_nan = bool(torch.equal(a.isnan(), b.isnan()))
    diff = float((a - b).abs().nan_to_num(0.0).max())
    return {
        "ratio": peer_s / ours_s,
        "agree": same_nan and diff <= TOLERANCE,
        "max_abs_diff": diff,
        "max_value": float(b.nan_to_num(0.0).abs().max()),
        "ours_s": ours_s,
        "peer_s": peer_s,
        "forward_s": forward_s,
        "forward_pass_equivalents_ours": ours_s / forward_s,
        "forward_pass_equivalents_peer": peer_s / forward_s,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, default=None, help="real data directory (uses SST test sentences)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per side (median reported)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    examples, description = sentences(args.data_dir)
    lengths = [len(ex.tokens) for ex in examples]
    common = {
        "commit": commit(),
        "cores": os.cpu_count(),
        "threads": 1,
        "inputs": description,
        "mean_length": sum(lengths) / len(lengths),
        "model": "randomly initialised, family default sizes (FAMILY_DEFAULTS)",
        "tolerance": TOLERANCE,
        "command": "benchmarks/bench_importance.py"
        + (f" --data-dir {args.data_dir}" if args.data_dir else "")
        + f" --repeats {args.repeats}",
        "repeats": args.repeats,
    }
    gradient_rows = {}
    summary: dict[str, Any] = {}
    for encoder in ENCODERS:
        run, batch = make_run(encoder, examples)
        forward_s = forward_seconds(run, batch, args.repeats)
        loo = compare(
            lambda: loo_importance(run, batch), lambda: loo_importance_reference(run, batch), args.repeats, forward_s
        )
        result = {
            "name": f"loo_{encoder}",
            **loo,
            "peer": "captum.attr.FeatureAblation, one ablated item position per forward pass",
            "encoder": encoder,
            **common,
        }
        atomic_write_json(RESULTS / f"loo_{encoder}.json", result)
        summary[encoder] = result
        print(
            f"loo {encoder:12s} ratio {loo['ratio']:6.1f}x  agree={loo['agree']}  max|diff| {loo['max_abs_diff']:.1e}  "
            f"forward passes {loo['forward_pass_equivalents_ours']:.1f} vs {loo['forward_pass_equivalents_peer']:.1f}"
        )
        grad = compare(
            lambda: gradient_importance(run, batch), lambda: saliency_gradient(run, batch), args.repeats, forward_s
        )
        gradient_rows[encoder] = grad
        print(f"gradient {encoder:7s} ratio {grad['ratio']:6.2f}x  agree={grad['agree']}  max|diff| {grad['max_abs_diff']:.1e}")
    gradient = {
        "name": "gradient",
        "ratio": min(r["ratio"] for r in gradient_rows.values()),
        "agree": all(r["agree"] for r in gradient_rows.values()),
        "ours_s": sum(r["ours_s"] for r in gradient_rows.values()),
        "peer_s": sum(r["peer_s"] for r in gradient_rows.values()),
        "peer": "captum.attr.Saliency(abs=False) on the embeddings, attention detached, times the input",
        "aggregation": "ratio = the smallest per-encoder ratio; ours_s/peer_s = sums over encoders",
        "per_encoder": gradient_rows,
        **common,
    }
    atomic_write_json(RESULTS / "gradient.json", gradient)
    return {"loo": summary, "gradient": gradient}


if __name__ == "__main__":
    main()
