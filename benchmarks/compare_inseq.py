"""inseq 0.7.1 against attnaudit on generated sequences: the same tokens, the same attributions under
matched definitions, and the time of each, on SmolLM2-135M-Instruct and a tiny random Marian.

Run from attnaudit's venv: ``python -m benchmarks.compare_inseq --venv ../inseq-venv`` (the venv of
``benchmarks/inseq_venv.sh``; without it, or without ``../shared/data/sst2``, it says so and exits 0 having
written nothing). Never part of ``make test``.

Prompts: the first ``--n`` GLUE SST-2 dev sentences as ``"Review: {text}\\nSentiment:"``; each model
continues each prompt greedily by ``--new-tokens`` tokens (ours: ``explain_text(..., generate=N)``;
inseq: ``model.attribute(prompt, generation_args={"max_new_tokens": N, "do_sample": False})``, with
transformers' forced end-of-sequence token switched off, as ours has none). Models: the SmolLM2 folder
attnaudit's GGUF cache de-quantised (float32), loaded by both from the same files, and
``attnaudit.architectures.save_tiny("marian")`` (3+3 layers, d = 32, random weights, a word-level
tokenizer whose vocabulary holds the template's words; SST-2's other words read as ``<unk>``).

Checks, on the tokens both attributed:

(a) the generated token ids are the same (and the source ids);
(b) per generated step, inseq's scores against ours under the matched definitions (Task 1's options):
    ``saliency`` against ``input_gradient`` with ``score=probability, reduction=l2``; ``integrated_gradients``
    (``--ig-steps``, UNK baseline at every position: ``include_eos_baseline=True``, since inseq's default
    keeps an end-of-sequence token as its own baseline and Marian's source ends with one) against ``ig`` with
    ``baseline=unk, reduction=l2`` and the same steps; both then divided by their sum per step, as inseq's
    ``aggregate()`` does. ``attention`` (inseq: the generating position's row, averaged over every layer and head)
    against the same mean over our captured weights (``attention_per_head``: every layer's row of the explained
    position, cross-attention for Marian; our ``attention`` method reads one layer, the last, so it is timed but
    not compared). Per step: max |inseq − ours| and Spearman's ρ (steps of three or more items);
(c) time: ``--repeats`` interleaved rounds; in each, for every prompt and method, one inseq call and one
    attnaudit call back to back, their order alternating between rounds. inseq runs in a persistent worker
    (``benchmarks/inseq_worker.py --serve``: imports and model load paid once) and is timed there around
    ``model.attribute`` alone; ours is ``explain_text`` on the loaded run, timed in this process. Both include
    the generation. An untimed first call of each (the one compared in (b)) warms both up.

Writes ``benchmarks/results/inseq_comparison.json`` (threads, ``OMP_*`` settings, versions, load averages,
commit). ``OMP_WAIT_POLICY`` is set to ``PASSIVE`` for both processes unless given: with OpenMP's default
busy-waiting, two threads on a shared 2-core machine made small products 15–30× slower (RECIPES).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported (OpenMP reads it once)

import argparse  # noqa: E402
import csv  # noqa: E402
import importlib.metadata  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import REPEATS, ROOT, PeerWorker, _load, stats, write_result  # noqa: E402

TEMPLATE = "Review: {text}\nSentiment:"
INSEQ_INSTALL = "benchmarks/inseq_venv.sh ../inseq-venv"
WORKER = ROOT / "benchmarks" / "inseq_worker.py"
TOLERANCE = 1e-4
"""Largest allowed max |inseq − ours| of a step's scores, each step's scores summing to 1 (float32 on both sides,
different batching: ours explains every step of a sequence in one padded batch, inseq one step at a time)."""
MIN_SPEARMAN = 0.99
"""Smallest allowed Spearman ρ of a step with three or more items."""
PAIRS = {
    # inseq method -> (our method, our options, how both are compared)
    "saliency": ("input_gradient", {"score": "probability", "reduction": "l2"}, "l1"),
    "integrated_gradients": ("ig", {"score": "probability", "reduction": "l2", "baseline": "unk"}, "l1"),
    "attention": ("attention", {}, "all_layers"),
}


class Worker(PeerWorker):
    """The persistent inseq worker: one JSON request per line, one answer per line."""

    def __init__(self, python: Path, threads: int) -> None:
        super().__init__(python, WORKER, threads, "inseq", SystemExit)


def sentences(data_dir: Path, n: int) -> list[str] | None:
    """The first ``n`` SST-2 dev sentences, or None without the file."""
    path = data_dir / "sst2" / "dev.tsv"
    if not path.is_file():
        return None
    with path.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [row["sentence"].strip() for row in rows[:n]]


def smollm2_folder(run: Any, scratch: Path) -> tuple[Path, str]:
    """The safetensors folder our GGUF cache wrote for SmolLM2 (the weights ``run`` was loaded from), else
    ``run``'s model and tokenizer saved into ``scratch``; and how the result file names it."""
    from attnaudit.models.hf import gguf_cache_folder as cache_folder
    from attnaudit.pretrained import smollm2_path

    cached = cache_folder(Path(smollm2_path()))
    if (cached / "config.json").is_file() and (cached / "model.safetensors").is_file():
        return cached, "SmolLM2-135M-Instruct (embedded GGUF, de-quantised by attnaudit's GGUF cache, float32)"
    folder = scratch / "smollm2"
    run.model.hf.save_pretrained(folder)
    run.model.tokenizer.save_pretrained(folder)
    return folder, "SmolLM2-135M-Instruct (embedded GGUF, loaded by attnaudit, saved with save_pretrained, float32)"


def per_step_ours(generated: Any, method: str) -> list[list[float]]:
    return [list(map(float, row)) for row in generated.scores[method]]


def all_layer_attention(run: Any, source: list[int], target: list[int]) -> list[list[float]]:
    """Per step, the explained position's attention averaged over every layer and head of our capture
    (``attention_per_head``: self-attention rows of a decoder, cross-attention rows of an encoder-decoder)."""
    import torch

    from attnaudit.explain.generation import decoder_rows, forced_row
    from attnaudit.explain.helpers.attention import attention_per_head

    model = run.model
    rows: list[list[float]] = []
    with torch.no_grad():
        if model.kind == "encoder-decoder":
            with model.forced_decision():
                for t in range(len(target)):
                    rows.append(attention_per_head(run, forced_row(model, source, target[:t]))[0].mean((0, 1)).tolist())
        else:
            with model.next_token_decision():
                batch = decoder_rows(model, source, target, len(target))
                means = attention_per_head(run, batch).mean((1, 2))
                rows = [means[t, : len(source) + t].tolist() for t in range(len(target))]
    return rows


def theirs_per_step(answer: dict[str, Any], kind: str, steps: int, source_len: int) -> list[list[float]]:
    """inseq's granular attributions of the first ``steps`` steps, per step over the items ours scores: a
    decoder's prompt and earlier tokens (``target_attributions``), an encoder-decoder's source tokens. Gradient
    methods: the L2 norm over the embedding (``aggregate()``'s first step); attention: the mean over layers and heads."""
    import numpy as np

    source = answer["source_attributions"]
    values = np.array(source if source is not None else answer["target_attributions"], dtype=float)  # None -> NaN
    rows = []
    for t in range(steps):
        column = values[:, t]
        if source is None:
            column = column[: source_len + t]
        if kind == "all_layers":
            rows.append(column.reshape(column.shape[0], -1).mean(-1).tolist())
        else:
            rows.append(np.linalg.norm(column, axis=-1).tolist())
    return rows


def compare(ours: list[list[float]], theirs: list[list[float]], normalise: bool) -> dict[str, Any]:
    """Per step: max |inseq − ours| (after dividing each by its sum when ``normalise``) and Spearman's ρ."""
    import numpy as np
    from scipy.stats import spearmanr

    diffs, rhos = [], []
    for mine, peer in zip(ours, theirs):
        a, b = np.array(mine, dtype=float), np.array(peer, dtype=float)
        if len(a) != len(b):
            raise SystemExit(f"step lengths differ: ours {len(a)}, inseq {len(b)}")
        if normalise:
            a, b = a / a.sum(), b / b.sum()
        diffs.append(float(np.abs(a - b).max()))
        rho = float(spearmanr(a, b).statistic) if len(a) > 2 else math.nan
        rhos.append(None if math.isnan(rho) else rho)
    known = [r for r in rhos if r is not None]
    return {"max_abs_diff": max(diffs), "max_abs_diff_per_step": diffs, "spearman_per_step": rhos,
            "spearman_min": min(known) if known else None,
            "agree": max(diffs) <= TOLERANCE and all(r >= MIN_SPEARMAN for r in known)}


def ours_call(run: Any, prompt: str, method: str, options: dict[str, Any], new_tokens: int, ig_steps: int) -> Any:
    from attnaudit.explain.text import explain_text

    return explain_text(run, prompt, methods=[method], generate=new_tokens, steps=ig_steps, options=options)


def bench_model(
    name: str, label: str, run: Any, folder: Path, worker: Worker, prompts: list[str], methods: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    """Tokens, agreement and interleaved times of every method on one model (``name``: its short name, for the log)."""
    from attnaudit.explain.generation import encode_exactly

    loaded = worker.ask(op="load", model=str(folder), threads=args.threads)
    model = run.model
    # attnaudit scores an encoder-decoder's earlier target tokens too: inseq is asked to as well (IG then integrates
    # both sides on each); the scores compared are the source's, which both give
    peer_args = {"max_new_tokens": args.new_tokens, "n_steps": args.ig_steps, "include_eos_baseline": True, "attribute_target": True}
    records: list[dict[str, Any]] = []
    for prompt in prompts:  # (a) and (b): one untimed call of each, which also warms both up
        source = encode_exactly(model.tokenizer, prompt)
        record: dict[str, Any] = {"prompt": prompt, "source_ids": source, "methods": {}}
        for peer_method in methods:
            mine, options, kind = PAIRS[peer_method]
            generated = ours_call(run, prompt, mine, options, args.new_tokens, args.ig_steps)
            answer = worker.ask(op="attribute", prompt=prompt, method=peer_method, raw=True, **peer_args)
            ours_ids = [step["id"] for step in generated.steps]
            start = answer["attr_pos_start"]
            peer_ids = answer["target_ids"][start: answer["attr_pos_end"]]
            steps = min(len(ours_ids), len(peer_ids))
            same = ours_ids == peer_ids[: len(ours_ids)] and answer["source_ids"] == source
            entry: dict[str, Any] = {
                "ours_definition": {mine: generated.meta["definitions"][mine]},
                "ours_generated_ids": ours_ids, "peer_generated_ids": peer_ids, "peer_source_ids": answer["source_ids"],
                "same_tokens": same, "steps_compared": steps,
                "peer_extra_steps": [int(i) for i in peer_ids[len(ours_ids):]],
            }
            if same:
                theirs = theirs_per_step(answer, kind, steps, len(source))
                ours = all_layer_attention(run, source, ours_ids) if kind == "all_layers" else per_step_ours(generated, mine)
                if model.kind == "encoder-decoder":
                    ours = [row[: len(source)] for row in ours]  # the source's scores (the target's follow them)
                entry.update(compare(ours[:steps], theirs, normalise=kind == "l1"))
            record["methods"][peer_method] = entry
        records.append(record)
        print(f"  {name}: {prompt[:40]!r}: " + ", ".join(
            f"{m} tokens {'=' if e['same_tokens'] else '≠'} max|Δ| {e.get('max_abs_diff', math.nan):.1e}" for m, e in record["methods"].items()),
            flush=True)
    # (c) interleaved timed rounds
    times: dict[str, dict[str, list[list[float]]]] = {m: {"ours": [[] for _ in prompts], "peer": [[] for _ in prompts],
                                                          "peer_roundtrip": [[] for _ in prompts]} for m in methods}
    load_before = _load()
    for round_ in range(args.repeats):
        for p, prompt in enumerate(prompts):
            for peer_method in methods:
                mine, options, _ = PAIRS[peer_method]
                for side in (("ours", "peer") if round_ % 2 == 0 else ("peer", "ours")):
                    start_time = time.perf_counter()
                    if side == "ours":
                        ours_call(run, prompt, mine, options, args.new_tokens, args.ig_steps)
                        times[peer_method]["ours"][p].append(time.perf_counter() - start_time)
                    else:
                        answer = worker.ask(op="attribute", prompt=prompt, method=peer_method, raw=False, **peer_args)
                        times[peer_method]["peer"][p].append(answer["seconds"])
                        times[peer_method]["peer_roundtrip"][p].append(time.perf_counter() - start_time)
        print(f"  {name}: round {round_ + 1}/{args.repeats} done (load {_load()})", flush=True)
    load_after = _load()
    timing: dict[str, Any] = {}
    for peer_method, sides in times.items():
        totals = {side: [sum(per_prompt[r] for per_prompt in sides[side]) for r in range(args.repeats)] for side in ("ours", "peer")}
        timing[peer_method] = {
            "ours_method": PAIRS[peer_method][0],
            "repeats": args.repeats,
            "order": "interleaved: per round, each prompt's inseq and attnaudit calls back to back, order alternating between rounds",
            "per_prompt": [{"ours": stats(o), "peer": stats(t), "peer_over_ours": stats([a / b for a, b in zip(t, o)]),
                            "peer_roundtrip": stats(rt)}
                           for o, t, rt in zip(sides["ours"], sides["peer"], sides["peer_roundtrip"])],
            "seconds": {"ours": stats(totals["ours"]), "peer": stats(totals["peer"])},
            "ratio": stats([t / o for t, o in zip(totals["peer"], totals["ours"])]),
            "load_average_before": load_before,
            "load_average_after": load_after,
        }
    agreement = {}
    for peer_method in methods:
        entries = [r["methods"][peer_method] for r in records]
        compared = [e for e in entries if "max_abs_diff" in e]
        rhos = [e["spearman_min"] for e in compared if e["spearman_min"] is not None]
        agreement[peer_method] = {
            "ours": PAIRS[peer_method][0], "ours_options": PAIRS[peer_method][1],
            "prompts_with_same_tokens": sum(e["same_tokens"] for e in entries), "prompts": len(entries),
            "max_abs_diff": max((e["max_abs_diff"] for e in compared), default=None),
            "spearman_min": min(rhos, default=None),
            "spearman_median_of_prompt_minima": statistics.median(rhos) if rhos else None,
            "agree": bool(compared) and len(compared) == len(entries) and all(e["agree"] for e in compared),
        }
    return {"model": label, "name": name, "peer_threads": loaded["threads"], "peer_versions": loaded["versions"],
            "encoder_decoder": loaded["is_encoder_decoder"], "agreement": agreement, "timing": timing, "prompts": records}


def versions() -> dict[str, str]:
    return {name: importlib.metadata.version(name) for name in ("attnaudit", "torch", "transformers", "captum")}


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--venv", type=Path, default=Path(os.environ.get("INSEQ_VENV", ROOT.parent / "inseq-venv")),
                        help="inseq 0.7.1's venv (benchmarks/inseq_venv.sh DIR); default $INSEQ_VENV or ../inseq-venv beside the checkout")
    parser.add_argument("--data-dir", type=Path, default=Path(os.environ.get("ATTNAUDIT_DATA", ROOT.parent / "shared" / "data")),
                        help="holds sst2/dev.tsv (default $ATTNAUDIT_DATA or ../shared/data)")
    parser.add_argument("--n", type=int, default=10, help="prompts: the first N SST-2 dev sentences")
    parser.add_argument("--new-tokens", type=int, default=5, help="greedy tokens generated after each prompt")
    parser.add_argument("--ig-steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=REPEATS, help="interleaved timed rounds")
    parser.add_argument("--threads", type=int, default=2, help="torch threads on each side")
    parser.add_argument("--methods", default=",".join(PAIRS), help=f"inseq methods, from {', '.join(PAIRS)}")
    parser.add_argument("--models", default="smollm2,marian", help="smollm2 and/or marian")
    args = parser.parse_args(argv)
    python = args.venv / "bin" / "python"
    if not python.is_file():
        print(f"compare_inseq skipped: no inseq venv at {args.venv}; build it with {INSEQ_INSTALL}")
        return None
    texts = sentences(args.data_dir, args.n)
    if texts is None:
        print(f"compare_inseq skipped: no SST-2 data ({args.data_dir / 'sst2' / 'dev.tsv'} is absent)")
        return None
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in PAIRS]
    if unknown:
        raise SystemExit(f"--methods: unknown {unknown}; choose from {', '.join(PAIRS)}")
    import torch

    from attnaudit.architectures import save_tiny
    from attnaudit.hf import load_hf

    torch.set_num_threads(args.threads)
    prompts = [TEMPLATE.format(text=t) for t in texts]
    scratch = Path(tempfile.mkdtemp(prefix="compare-inseq-"))
    worker = Worker(python, args.threads)
    models = []
    try:
        for name in [m.strip() for m in args.models.split(",") if m.strip()]:
            if name == "smollm2":
                run = load_hf("smollm2", device="cpu")
                folder, label = smollm2_folder(run, scratch)
            elif name == "marian":
                folder = save_tiny("marian", scratch / "marian", seed=0)
                run = load_hf(str(folder), device="cpu")
                label = "tiny random Marian (attnaudit.architectures.save_tiny('marian', seed=0): 3+3 layers, d=32, 4 heads)"
            else:
                raise SystemExit(f"--models: unknown {name!r}; choose smollm2, marian")
            print(f"{label}: {len(prompts)} prompts, {', '.join(methods)}", flush=True)
            models.append(bench_model(name, label, run, folder, worker, prompts, methods, args))
    finally:
        worker.close()
        shutil.rmtree(scratch, ignore_errors=True)
    result = {
        "peer": "inseq 0.7.1 (its own venv: benchmarks/inseq_venv.sh), a persistent worker (benchmarks/inseq_worker.py --serve)",
        "data": f"the first {len(prompts)} GLUE SST-2 dev sentences as {TEMPLATE!r}",
        "generation": f"greedy, {args.new_tokens} new tokens (inseq: transformers' forced end-of-sequence token switched off)",
        "ig_steps": args.ig_steps,
        "threads": args.threads,
        "omp": {key: os.environ.get(key) for key in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS")},
        "versions": versions(),
        "tolerance": f"per step, scores divided by their sum (attention: as is): max |inseq − ours| <= {TOLERANCE:g} "
                     f"and Spearman ρ >= {MIN_SPEARMAN} (steps of 3+ items)",
        "definitions": {m: {"ours": PAIRS[m][0], "ours_options": PAIRS[m][1]} for m in methods},
        "peer_attributions": "inseq's granular attributions as model.attribute stores them (before aggregate()); reduced here: "
                             "L2 over the embedding then divided by the step's sum (gradient methods), mean over layers and heads (attention)",
        "encoder_decoders": "both attribute the earlier target tokens too (inseq: attribute_target=True; IG integrates both "
                            "sides on each); the source's scores are compared",
        "attention_note": "ours: the mean over every layer and head of attention_per_head (our capture); "
                          "our attention method reads the last layer only, so it is what is timed, not what is compared",
        "same_tokens": all(e["same_tokens"] for m in models for r in m["prompts"] for e in r["methods"].values()),
        "agree": all(a["agree"] for m in models for a in m["agreement"].values()),
        "models": models,
    }
    write_result("inseq_comparison", result)
    return result


if __name__ == "__main__":
    out = main()
    for m in out["models"] if out else []:
        for method, a in m["agreement"].items():
            t = m["timing"][method]
            print(f"{m['name']} {method} vs {a['ours']}: tokens same in {a['prompts_with_same_tokens']}/{a['prompts']}, "
                  f"max|Δ| {a['max_abs_diff']}, ρ min {a['spearman_min']}; all prompts per round: ours "
                  f"{t['seconds']['ours']['median']:.2f} s, inseq {t['seconds']['peer']['median']:.2f} s, "
                  f"inseq/ours {t['ratio']['median']:.2f}")
