"""Cost of the faithfulness scoreboard on fine-tuned MiniLM, per explanation method and per removal mode.

On the first ``--sentences`` GLUE SST-2 dev sentences, batched as ``attnaudit run faithfulness``
batches them (grouped by length, ``--batch-size``), every explanation method that applies and the
batched perturbations of each removal mode (every bin and curve point of every method at once) are
timed ``--repeats`` times (wall and process CPU seconds; min / median / max), and the medians are
extrapolated to ``--limit`` sentences. Two speed-ups are timed against the code they replaced, in
interleaved rounds (:func:`benchmarks.common.time_interleaved`) on ``--compare`` sentences:
Value Zeroing computed in closed form vs rerunning the model from the layer per zeroed token, and
attention flow solved only for the explanation query's row vs every layer and row; each side's
outputs are also compared with the closed form run in float64 (how far float32 rounding moves them).

Needs a fine-tuned run (``attnaudit finetune --task sst2 --limit 4000``); kept out of ``make bench``.
Writes ``benchmarks/results/profile_scoreboard.json``. Run:
``nice -n 5 .venv/bin/python benchmarks/profile_scoreboard.py --run benchmarks/runs/minilm-sst2 --data-dir ../shared/data``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks.common` when run as a script

from attnaudit.algorithms.attention_graph import flow  # noqa: E402
from attnaudit.data.types import Batch  # noqa: E402
from attnaudit.experiments.eraser_metrics import BINS, MODES, perturbation_probs  # noqa: E402
from attnaudit.experiments.faithfulness import grid  # noqa: E402
from attnaudit.explain import list_explanations  # noqa: E402
from attnaudit.explain.helpers.residual import layers_up_to, pair_mask, rolled_contributions  # noqa: E402
from attnaudit.explain.helpers.rollout import explained_record, layer_weights  # noqa: E402
from attnaudit.explain.methods.attention_flow import flow_importance  # noqa: E402
from attnaudit.explain.methods.value_zeroing import cosine_distance, value_zeroing  # noqa: E402
from attnaudit.explain.registry import on_items, query_row  # noqa: E402
from attnaudit.models.interface import AttentionModel, Intervention, evaluation  # noqa: E402
from attnaudit.run import Run, load_run  # noqa: E402
from benchmarks.common import REPEATS, stats, time_interleaved, write_result  # noqa: E402


def rerun_zeroing(model: AttentionModel, batch: Batch) -> Tensor:
    """Value Zeroing as it was computed before: per layer and zeroed token, a copy of each example
    rerun from that layer to the output (``model.decode`` with a value intervention)."""
    with evaluation(model), torch.no_grad():
        trace, index, record = explained_record(model, batch)
        base = model.encode(batch)
        maps = []
        for layer, r in layers_up_to(trace, index):
            cache = model.cache_at(trace, layer, base)
            b, t = cache.states.shape[:2]
            keep = (1.0 - torch.eye(t, dtype=cache.states.dtype)).repeat(b, 1)  # row e*t + j: token j zeroed
            copies = cache.select(torch.arange(b).repeat_interleave(t))
            zeroed = Intervention(layer=layer, values=lambda v, keep=keep: v * keep[:, None, :, None])
            changed = model.decode(copies, [zeroed], start_layer=layer).trace[0].outputs.reshape(b, t, t, -1)
            distance = cosine_distance(r.outputs[:, None], changed)  # (B, zeroed, Q)
            maps.append(distance.transpose(1, 2).clamp_min(0.0) * pair_mask(r))
    return rolled_contributions(model, batch, maps, record)


def every_row_flow(model: AttentionModel, batch: Batch) -> Tensor:
    """Attention flow as it was computed before: every layer and row, then the query's row read."""
    trace, index, record = explained_record(model, batch)
    flowed = flow(layer_weights(trace, index), mask=record.mask)[:, -1]
    return on_items(model, batch, query_row(model, flowed, record.query_mask))


def batches(run: Run, sentences: int, batch_size: int, data_dir: str) -> list[Batch]:
    """The first ``sentences`` test sentences in the scoreboard's batches (grouped by length)."""
    examples = sorted(run.examples("test", sentences, data_dir=data_dir), key=lambda e: len(e.tokens))
    return list(run.batches(examples, batch_size))


def in_float64(model: torch.nn.Module, fn: Any) -> Tensor:
    """``fn()`` with the model in float64 (then float32 again: exact both ways)."""
    model.double()
    try:
        return fn().double()
    finally:
        model.float()


def timed(fn: Any, repeats: int) -> dict[str, Any]:
    """Wall and process-CPU seconds of ``fn()`` over ``repeats`` runs (after one untimed run)."""
    fn()
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return {"wall_seconds": stats(walls), "cpu_seconds": stats(cpus)}


def per_method(run: Run, parts: list[Batch], repeats: int, steps: int) -> tuple[dict[str, Any], list[dict[str, Tensor]]]:
    """Each method's timing over ``parts``, and its scores per batch (for the perturbation timing)."""
    out, scores = {}, [{} for _ in parts]
    for method in list_explanations(run):
        def explain(method: Any = method) -> None:
            for i, batch in enumerate(parts):
                scores[i][method.name] = method(run.model, batch, steps=steps, seed=0).detach().double()

        out[method.name] = timed(explain, repeats)
        print(f"{method.name}: {out[method.name]['cpu_seconds']['median']:.2f} s CPU", flush=True)
    return out, scores


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="benchmarks/runs/minilm-sst2", help="a fine-tuned MiniLM run")
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--sentences", type=int, default=50, help="GLUE-dev sentences timed per method")
    parser.add_argument("--compare", type=int, default=8, help="sentences for the before/after comparisons")
    parser.add_argument("--limit", type=int, default=500, help="sentences to extrapolate the scoreboard's cost to")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--ig-steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    run = load_run(args.run, device="cpu", data_dir=args.data_dir)
    load = [round(x, 2) for x in os.getloadavg()]
    parts = batches(run, args.sentences, args.batch_size, args.data_dir)
    methods, scores = per_method(run, parts, args.repeats, args.ig_steps)
    percents = grid(list(BINS), 10)
    modes = {}
    for mode in MODES:
        modes[mode] = timed(lambda mode=mode: [perturbation_probs(run.model, b, s, percents, mode) for b, s in zip(parts, scores)],
                            args.repeats)
        print(f"perturb {mode}: {modes[mode]['cpu_seconds']['median']:.2f} s CPU", flush=True)
    scale = args.limit / args.sentences
    cpu = {k: v["cpu_seconds"]["median"] * scale for k, v in {**methods, **{f"perturb_{m}": t for m, t in modes.items()}}.items()}
    small = batches(run, args.compare, args.compare, args.data_dir)[0]
    compare = {}
    for name, fast, slow in (("value_zeroing", value_zeroing, rerun_zeroing), ("flow", flow_importance, every_row_flow)):
        record, outputs = time_interleaved({"ours": lambda f=fast: f(run.model, small), "peer": lambda f=slow: f(run.model, small)},
                                           args.repeats)
        record["max_abs_diff"] = float((outputs["ours"] - outputs["peer"]).abs().max())
        reference = in_float64(run.model, lambda f=fast: f(run.model, small))  # what float32 rounding is measured against
        record["max_abs_diff_from_float64"] = {side: float((out.double() - reference).abs().max()) for side, out in outputs.items()}
        compare[name] = record
        print(f"{name}: before / now {record['ratio']['median']:.1f}x, max diff {record['max_abs_diff']:.2e}, "
              f"from float64 {record['max_abs_diff_from_float64']}", flush=True)
    result = {
        "run": args.run, "sentences": args.sentences, "batch_size": args.batch_size, "repeats": args.repeats,
        "ig_steps": args.ig_steps, "threads": args.threads, "percents": percents,
        "methods": methods, "perturb": modes, "compare_sentences": args.compare, "before_after": compare,
        "extrapolated_cpu_seconds": {"limit": args.limit, **cpu, "total": sum(cpu.values())},
        "load_average_before": load, "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }
    write_result("profile_scoreboard", result)
    print({"extrapolated_total_cpu_seconds": round(result["extrapolated_cpu_seconds"]["total"], 1)})
    return result


if __name__ == "__main__":
    main()
