"""AttnLRP / CP-LRP: our registry methods against the authors' library lxt 2.1 (its own venv) and against
Integrated Gradients, on the same inputs of SmolLM2 zero-shot and of a fine-tuned MiniLM.

Models: SmolLM2-135M-Instruct (embedded GGUF, float32) classifying the first ``--n`` GLUE SST-2 dev
sentences zero-shot (the ``sst2`` prompt and verbalizer), and, with ``--run``, a MiniLM fine-tuned by
``attnaudit finetune`` on the same sentences (lxt 2.1 has no CP-LRP map for BERT: AttnLRP only).
lxt explains each prompt alone and unpadded (its documented recipe) in a subprocess with the lxt venv's
python (:mod:`benchmarks.lxt_case`); its time is the worker's own time for one pass over the inputs
(model built, interpreter started: not counted). Ours explains the padded batch in one call.

Per round (``--repeats``, order reversed every other round, one torch thread each): ours ``attnlrp``,
ours ``cp_lrp`` (the batch), ours ``ig`` (``--ig-steps``, the faithfulness test's default 20; one input at
a time, as its memory grows with inputs × steps), lxt's AttnLRP (and
CP-LRP on SmolLM2). Agreement on the last round's outputs: max |ours − lxt| over real tokens, the
largest |relevance|, Spearman's ρ per input of three or more tokens (min, median).
Writes ``benchmarks/results/lrp.json``; without the lxt venv it says so and exits 0 having written nothing.
Run: ``nice -n 5 .venv/bin/python -m benchmarks.bench_lrp --data-dir ../shared/data --n 5 --run
benchmarks/runs/minilm-sst2`` (``python -m benchmarks bench_lrp`` runs the defaults: SmolLM2 alone, 10 sentences).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from scipy.stats import spearmanr

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import REPEATS, _load, stats, write_result  # noqa: E402
from benchmarks.lxt_case import LXT_INSTALL, as_tensor, lxt_python, real_ids, run_lxt, write_case  # noqa: E402

TOLERANCE = 1e-4
"""Largest allowed ``|ours − lxt|`` over the largest ``|relevance|`` (float32, different batching)."""


def agreement(ours: torch.Tensor, theirs: list[list[float]], mask: torch.Tensor) -> dict[str, Any]:
    """Max abs difference on real tokens, the scale, whether within :data:`TOLERANCE`, Spearman's ρ per input."""
    peer = as_tensor(theirs, ours.shape[1])
    real = mask.bool()
    diff = float((ours.double()[real] - peer[real]).abs().max())
    scale = float(peer[real].abs().max())
    rhos = [float(spearmanr(o[m].numpy(), t).statistic) for o, t, m in zip(ours.double(), theirs, real) if len(t) > 2]
    return {"max_abs_diff": diff, "max_abs_relevance": scale, "agree": diff <= TOLERANCE * scale,
            "spearman_min": min(rhos), "spearman_median": statistics.median(rhos), "inputs": len(theirs)}


def rounds(fns: dict[str, Callable[[], tuple[Any, float | None]]], repeats: int) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Each function once per round, order reversed every other round; a function returning its own
    seconds (lxt's worker) is timed by those, the others by the wall clock. Times and last outputs."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    outputs: dict[str, Any] = {}
    names = list(fns)
    for round_ in range(repeats):
        for name in names if round_ % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            outputs[name], own = fns[name]()
            times[name].append(own if own is not None else time.perf_counter() - start)
    return times, outputs


def bench_model(label: str, run: Any, batch: Any, rules: tuple[str, ...], repeats: int, ig_steps: int) -> dict[str, Any]:
    """Time ours, IG and lxt on one model's batch; agreement with lxt per rule."""
    from attnaudit.explain import get_explanation
    from attnaudit.explain.helpers.lrp import lrp_relevance

    model = run.model.eval()
    ig = get_explanation("ig")
    folder = Path(tempfile.mkdtemp(prefix=f"lxt-{label}-"))
    cases = {rule: write_case(model, real_ids(batch), rule, folder / rule) for rule in rules}

    def lxt(rule: str) -> Callable[[], tuple[Any, float]]:
        def call() -> tuple[Any, float]:
            out = run_lxt(cases[rule])
            return out, out["seconds"][0]
        return call

    fns: dict[str, Callable[[], tuple[Any, float | None]]] = {}
    for rule in ("attnlrp", "cp_lrp"):
        fns[rule] = lambda rule=rule: (lrp_relevance(model, batch, rule), None)
    singles = [run.collate([example]) for example in batch.examples]  # one at a time, as lxt: IG's memory grows with inputs × steps
    fns["ig"] = lambda: ([ig(run, single, steps=ig_steps) for single in singles], None)
    fns.update({f"lxt_{rule}": lxt(rule) for rule in rules})
    load_before = _load()
    try:
        times, outputs = rounds(fns, repeats)
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # the saved weights (SmolLM2: 0.5 GB per rule)
    timing = {
        "repeats": repeats,
        "order": "interleaved: one run of each per round, order reversed every other round",
        "seconds": {name: stats(values) for name, values in times.items()},
        **{f"lxt_over_ours_{rule}": stats([t / o for t, o in zip(times[f"lxt_{rule}"], times[rule])]) for rule in rules},
        "ig_over_attnlrp": stats([t / o for t, o in zip(times["ig"], times["attnlrp"])]),
        "load_average_before": load_before,
        "load_average_after": _load(),
    }
    agree = {rule: agreement(outputs[rule], outputs[f"lxt_{rule}"]["relevance"], batch.mask) for rule in rules}
    return {"model": label, "n": len(batch.examples), "tokens": int(batch.mask.sum()), "timing": timing, "lxt": agree}


def main(argv: list[str] | None = None) -> dict | None:
    """Run both models (MiniLM only with ``--run``), write the result file and return its content."""
    from attnaudit.hf import load_hf
    from attnaudit.run import load_run

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default=os.environ.get("ATTNAUDIT_DATA"), help="default $ATTNAUDIT_DATA")
    parser.add_argument("--n", type=int, default=10, help="first N GLUE SST-2 dev sentences")
    parser.add_argument("--run", default=None, help="a fine-tuned MiniLM run (attnaudit finetune --task sst2)")
    parser.add_argument("--ig-steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=REPEATS, help="interleaved timed rounds")
    args = parser.parse_args(argv)
    if lxt_python() is None:
        print(f"bench_lrp skipped: no lxt venv; build it with {LXT_INSTALL}")
        return None
    torch.set_num_threads(1)
    models = []
    smollm2 = load_hf("smollm2", task="sst2", data_dir=args.data_dir, device="cpu")
    batch = smollm2.collate(smollm2.data().test[: args.n])
    models.append(bench_model("SmolLM2-135M-Instruct zero-shot sst2", smollm2, batch, ("attnlrp", "cp_lrp"), args.repeats, args.ig_steps))
    if args.run:
        minilm = load_run(args.run, device="cpu", data_dir=args.data_dir)
        batch = minilm.collate(minilm.data().test[: args.n])
        models.append(bench_model("MiniLM fine-tuned on SST-2", minilm, batch, ("attnlrp",), args.repeats, args.ig_steps))
    first = models[0]["timing"]
    result = {
        "ratio": first["lxt_over_ours_attnlrp"]["median"],
        "ours_s": first["seconds"]["attnlrp"]["median"],
        "peer_s": first["seconds"]["lxt_attnlrp"]["median"],
        "agree": all(a["agree"] for m in models for a in m["lxt"].values()),
        "max_abs_diff": max(a["max_abs_diff"] for m in models for a in m["lxt"].values()),
        "tolerance": f"max |ours − lxt| <= {TOLERANCE:g} × max |lxt relevance| (real tokens)",
        "peer": "lxt 2.1 (transformers 4.57.6, its own venv), one unpadded input at a time; time of its passes only",
        "models": models,
    }
    write_result("lrp", result)
    return result


if __name__ == "__main__":
    out = main()
    for m in out["models"] if out else []:
        seconds = m["timing"]["seconds"]
        line = ", ".join(f"{k} {v['median']:.2f}s ({v['min']:.2f}–{v['max']:.2f})" for k, v in seconds.items())
        agree = "; ".join(f"{r}: max|diff| {a['max_abs_diff']:.1e} of {a['max_abs_relevance']:.2g}, ρ min {a['spearman_min']:.4f}"
                          for r, a in m["lxt"].items())
        print(f"{m['model']} ({m['n']} inputs, {m['tokens']} tokens): {line}; {agree}")
