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

Sentences: the first 64 sentences of Jain & Wallace's SST test split when a data directory
is given (``--data-dir``, default ``$ATTNAUDIT_DATA``, which ``make bench`` sets), else 64
synthetic sentences of 15-25 tokens (SST's test sentences average ~19 tokens). Ours, the
peer and one batched forward pass of the same model over the same sentences are timed in
``--repeats`` interleaved rounds (:func:`benchmarks.common.time_interleaved`); the ratio is
taken per round. Cost is also given in forward-pass equivalents: each side's median time over
the forward pass's (``forward_pass_equivalents_ours`` / ``_peer``).
Run: ``.venv/bin/python -m benchmarks.bench_importance [--data-dir ../shared/data] [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from functools import partial
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
from attnaudit.explain.methods.gradient import gradient_importance
from attnaudit.explain.methods.loo import loo_importance, loo_importance_reference
from attnaudit.models import ModelConfig, build_model, detach_weights
from attnaudit.run import Run, TaskSpec
from attnaudit.training.trainer import FAMILY_DEFAULTS
from benchmarks.common import (
    REPEATS,
    headline,
    ratio_span,
    time_interleaved,
    write_result,
)

ENCODERS = ("bilstm", "average", "cnn", "transformer")
LABELS = ["negative", "positive"]
N_SENTENCES = 64
GRADIENT_HEADLINE = "bilstm"
TOLERANCE = 1e-5


def sentences(data_dir: Path | None) -> tuple[list[Example], str]:
    """The 64 sentences to explain and a description of them."""
    if data_dir is not None:
        path = data_dir / "sst" / "sst_dataset.csv"
        return read_jw_sst_csv(path)["test"][:N_SENTENCES], f"first {N_SENTENCES} SST test sentences (DATA/sst/sst_dataset.csv)"
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


def compare(run: Run, batch: Batch, ours: Callable[[], torch.Tensor], peer: Callable[[], torch.Tensor], repeats: int) -> dict[str, Any]:
    """Time ours, the peer and a plain forward pass interleaved; check ours and the peer agree
    (NaN where the other is NaN, else within TOLERANCE)."""

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return run.model(batch).logits

    timing, out = time_interleaved({"ours": ours, "peer": peer, "forward": forward}, repeats)
    a, b = out["ours"], out["peer"]
    same_nan = bool(torch.equal(a.isnan(), b.isnan()))
    diff = float((a - b).abs().nan_to_num(0.0).max())
    top = headline(timing)
    forward_s = timing["seconds"]["forward"]["median"]
    return {
        **top,
        "agree": same_nan and diff <= TOLERANCE,
        "max_abs_diff": diff,
        "max_value": float(b.nan_to_num(0.0).abs().max()),
        "forward_s": forward_s,
        "forward_pass_equivalents_ours": top["ours_s"] / forward_s,
        "forward_pass_equivalents_peer": top["peer_s"] / forward_s,
        "timing": timing,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, default=os.environ.get("ATTNAUDIT_DATA"),
                        help="real data directory, uses SST test sentences (default $ATTNAUDIT_DATA)")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="interleaved timed rounds")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    examples, description = sentences(args.data_dir)
    lengths = [len(ex.tokens) for ex in examples]
    common = {
        "threads": 1,
        "inputs": description,
        "mean_length": sum(lengths) / len(lengths),
        "model": "randomly initialised, family default sizes (FAMILY_DEFAULTS)",
        "tolerance": TOLERANCE,
    }
    gradient_rows = {}
    summary: dict[str, Any] = {}
    for encoder in ENCODERS:
        run, batch = make_run(encoder, examples)
        loo = compare(run, batch, partial(loo_importance, run, batch), partial(loo_importance_reference, run, batch), args.repeats)
        result = {
            **loo,
            "peer": "captum.attr.FeatureAblation, one ablated item position per forward pass",
            "encoder": encoder,
            **common,
        }
        write_result(f"loo_{encoder}", result)
        summary[encoder] = result
        print(
            f"loo {encoder:12s} ratio {ratio_span(loo['timing']['ratio'])}  agree={loo['agree']}  "
            f"max|diff| {loo['max_abs_diff']:.1e}  forward passes "
            f"{loo['forward_pass_equivalents_ours']:.1f} vs {loo['forward_pass_equivalents_peer']:.1f}"
        )
        grad = compare(run, batch, partial(gradient_importance, run, batch), partial(saliency_gradient, run, batch), args.repeats)
        gradient_rows[encoder] = grad
        print(f"gradient {encoder:7s} ratio {ratio_span(grad['timing']['ratio'])}  agree={grad['agree']}  "
              f"max|diff| {grad['max_abs_diff']:.1e}")
    headline_row = gradient_rows[GRADIENT_HEADLINE]
    gradient = {
        **{key: headline_row[key] for key in ("ratio", "ours_s", "peer_s", "timing")},
        "agree": all(r["agree"] for r in gradient_rows.values()),
        "encoder": GRADIENT_HEADLINE,
        "peer": "captum.attr.Saliency(abs=False) on the embeddings, attention detached, times the input",
        "aggregation": f"ratio, ours_s, peer_s, timing: the {GRADIENT_HEADLINE} model's (Jain & Wallace's); "
        "agree: every encoder; each encoder's own figures in per_encoder",
        "per_encoder": gradient_rows,
        **common,
    }
    write_result("gradient", gradient)
    return {"loo": summary, "gradient": gradient}


if __name__ == "__main__":
    main()
