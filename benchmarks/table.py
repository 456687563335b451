"""``python -m benchmarks.table``: write the benchmark page's tables and the README's models table from ``benchmarks/results/*.json``.

Everything between ``<!-- bench-table:start -->`` and ``<!-- bench-table:end -->`` in docs/sections/benchmarks.md
is generated here (and, between ``<!-- llm-scale-table:start -->`` and ``<!-- llm-scale-table:end -->``,
the decoder-LLM scale tables of ``benchmarks/results/llm_scale_<device>.json``): one row per speed benchmark
(ratio peer / ours and both times as median (min–max) over the interleaved rounds of :func:`benchmarks.common.time_interleaved`), the
training throughput, the cost in forward-pass equivalents, and the machine, load and command
the numbers were taken under. ``--check`` writes nothing and exits 1 when README.md is stale
(``tests/test_bench_table.py`` checks the same).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, ROOT, ratio_span, span

README = ROOT / "README.md"
"""Holds the models block (``architectures.json``)."""
PAGE = ROOT / "docs" / "sections" / "benchmarks.md"
"""Holds the benchmark table and the decoder-LLM scale tables."""
TO_ROOT = "../../"
"""The repository's root seen from :data:`PAGE` (its figure links)."""
START = "<!-- bench-table:start -->"
END = "<!-- bench-table:end -->"
LLM_START = "<!-- llm-scale-table:start -->"
LLM_END = "<!-- llm-scale-table:end -->"
MODELS_START = "<!-- models-table:start -->"
MODELS_END = "<!-- models-table:end -->"
LLM_RESULTS = ("llm_scale_cpu", "llm_scale_cuda")  # benchmarks/bench_llm_scale.py, one file per device
ROWS_RESULTS = ("capture_rows_cpu", "capture_rows_cuda")  # benchmarks/bench_capture_rows.py
LLM_TIMES = (("peer", "HF eager"), ("capture", "capture"), ("norms", "norms"), ("rollout", "rollout, all layers"),
             ("rollout_streaming", "rollout, streaming"))
LLM_MEMORY = (("peer", "HF eager"), ("capture", "capture"), ("rollout", "rollout all"), ("rollout_streaming", "streaming"))
CAPTUM_ABLATION = "Captum `FeatureAblation`"
LOOP = "per-instance loop over the full model"
ENCODER_NAMES = {"bilstm": "BiLSTM", "average": "average encoder", "cnn": "CNN", "transformer": "Transformer"}


@dataclass(frozen=True)
class Row:
    """A table row: the result file's stem, its label (``str.format`` over the JSON) and the peer."""

    stem: str
    label: str
    peer: str


ROWS = (
    Row("loo_bilstm", "leave-one-out, BiLSTM", CAPTUM_ABLATION),
    Row("loo_average", "leave-one-out, average encoder", CAPTUM_ABLATION),
    Row("loo_cnn", "leave-one-out, CNN", CAPTUM_ABLATION),
    Row("loo_transformer", "leave-one-out, Transformer", CAPTUM_ABLATION),
    Row("gradient", "gradient importance, {encoder_name}", "Captum `Saliency`"),
    Row("permutation", "permutation, {instances} × {permutations}", LOOP),
    Row("adversarial", "adversarial search, {instances} × {adversaries} × {steps} steps", LOOP),
    Row("erasure", "erase until flip, {n} instances", "one instance at a time"),
    Row("flow", "attention flow, {shape[tokens]} tokens × {shape[layers]} layers", "networkx max-flow per token pair"),
    Row("norms", "norm analysis on MiniLM", "HF forward, `output_attentions=True`"),
    Row("llm_loo", "leave-one-out, SmolLM2 zero-shot, {sentences} SST-2 prompts ({deletions} deletions)",
        "the same deletions, each prompt rerun in full (batched)"),
    Row("llm_captum", "Integrated Gradients, SmolLM2 zero-shot, {n} SST-2 prompts × {steps} steps",
        "Captum `LayerIntegratedGradients` on HF's model"),
    Row("ray_audit", "SmolLM2 audit of {sentences} SST-2 sentences in shards, {workers} local Ray workers (Ray's start included)",
        "the same audit in one process"),
)


LRP_PEER = "lxt 2.1 (own venv), one unpadded input at a time"
LRP_METHODS = {"attnlrp": "AttnLRP", "cp_lrp": "CP-LRP"}
INSEQ_PEER = "inseq 0.7.1 (own venv, a persistent worker), generation included"
INSEQ_METHODS = {
    "saliency": "inseq `saliency` vs `input_gradient` (probability, L2)",
    "integrated_gradients": "inseq IG ({ig_steps} steps) vs `ig` (UNK baseline, L2)",
    "attention": "inseq `attention` vs `attention` (timed; compared: all-layer mean)",
}
INSEQ_MODELS = {"smollm2": "SmolLM2", "marian": "tiny Marian"}


def load(folder: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """Every result file of :data:`ROWS` and ``training.json`` that exists, by stem, and the rows of
    ``lrp.json`` (:func:`lrp_results`) and of ``inseq_comparison.json`` (:func:`inseq_results`)."""
    stems = [row.stem for row in ROWS] + ["training"]
    results = {stem: json.loads((folder / f"{stem}.json").read_text(encoding="utf-8"))
               for stem in stems if (folder / f"{stem}.json").exists()}
    if (folder / "lrp.json").exists():
        results.update(lrp_results(json.loads((folder / "lrp.json").read_text(encoding="utf-8"))))
    if (folder / "inseq_comparison.json").exists():
        results.update(inseq_results(json.loads((folder / "inseq_comparison.json").read_text(encoding="utf-8"))))
    if (folder / "perturbation_captum.json").exists():
        results.update(perturbation_results(json.loads((folder / "perturbation_captum.json").read_text(encoding="utf-8"))))
    if (folder / "batched_lstm.json").exists():
        results.update(batched_results(json.loads((folder / "batched_lstm.json").read_text(encoding="utf-8"))))
    if (folder / "together_cuda.json").exists():
        results.update(together_results(json.loads((folder / "together_cuda.json").read_text(encoding="utf-8"))))
    return results


def together_results(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``benchmarks/bench_together.py``'s result as one row (stem ``batched:together``): K ROAR retrains trained as one
    stacked model against one at a time; they agree when every job's test scores do (to 1e-3; the column shows the
    largest test-score difference, the weights' is on the training-tests page)."""
    timing = data["timing"]
    gap = max(abs(job["together"][k] - job["separate"][k]) for job in data["test_scores"] for k in job["together"])
    label = (f"ROAR retrains trained together on one {data['device']}: {data['models']} SST BiLSTM retrains ({data['preset']}, "
             f"{data['epochs']} epoch each, each with its own seed and masked data) as one stacked model")
    return {"batched:together": {
        "label": label, "peer": f"the {data['models']} retrains one at a time (cuDNN)",
        "timing": {"repeats": timing["repeats"], "ratio": timing["speedup"],
                   "seconds": {"ours": timing["seconds"]["together"], "peer": timing["seconds"]["separate"]},
                   "load_average_before": timing["load_average_before"], "load_average_after": timing["load_average_after"]},
        "agree": gap < 1e-3, "max_abs_diff": gap,
        **{key: data[key] for key in ("machine", "command", "commit")},
    }}


def batched_results(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``benchmarks/bench_batched_lstm.py``'s result as one row (stem ``batched:lstm``): K models' BiLSTM training
    step stacked into one module against K ``nn.LSTM`` passes, with the roofline bound on any batching here."""
    shape, timing, roof = data["shape"], data["timing"], data["roofline"]
    label = (f"batched retraining: {shape['models']} BiLSTM encoders' forward + backward (batch {shape['batch']}, {shape['embed']}-d, "
             f"{shape['hidden']} units) stacked in one module; the separate passes already run at "
             f"{roof['fraction_of_peak']:.0%} of this CPU's matmul peak, so no batching can exceed {roof['speedup_bound']['median']:.1f}×")
    tolerance = data["equal"]
    return {"batched:lstm": {
        "label": label, "peer": f"{shape['models']} `nn.LSTM` passes, one model at a time",
        "timing": {"repeats": timing["repeats"], "ratio": timing["speedup"],
                   "seconds": {"ours": timing["seconds"]["stacked"], "peer": timing["seconds"]["separate"]},
                   "load_average_before": timing["load_average_before"], "load_average_after": timing["load_average_after"]},
        "agree": tolerance["max_output_difference"] < 1e-5 and tolerance["max_gradient_difference"] < 1e-4,
        "max_abs_diff": max(tolerance.values()),
        **{key: data[key] for key in ("machine", "command", "commit")},
    }}


PERTURBATION_LABELS = {"occlusion": "`occlusion` (window 1)", "shapley": "`shapley` ({permutations} order(s))",
                       "kernel_shap": "`kernel_shap` ({samples} coalitions)", "lime": "`lime` ({samples} coalitions)"}


def perturbation_results(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``benchmarks/bench_perturbation_captum.py``'s result as one row per method against Captum's ``LLMAttribution``
    (stem ``perturbation:<method>``): ratio Captum / ours per round, both times, the agreement and the machine."""
    rows = {}
    timing = data["timing"]
    for method, record in data["methods"].items():
        label = PERTURBATION_LABELS.get(method, f"`{method}`").format(**data)
        rows[f"perturbation:{method}"] = {
            "label": f"{label}, SmolLM2 next token, a {data['tokens']}-token prompt, {data['baseline']} baseline",
            "peer": f"{record['peer']} in `LLMAttribution` (`TextTokenInput`) on HF's model",
            "timing": {"repeats": timing["repeats"], "ratio": timing[method],
                       "seconds": {"ours": timing["seconds"][f"ours_{method}"], "peer": timing["seconds"][f"peer_{method}"]},
                       "load_average_before": timing["load_average_before"], "load_average_after": timing["load_average_after"]},
            "agree": record["agree"], "max_abs_diff": record["max_abs_diff"],
            **{key: data[key] for key in ("machine", "command", "commit")},
        }
    return rows


def inseq_results(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``benchmarks/compare_inseq.py``'s result as one row per model and method (stem ``inseq:<model>:<method>``):
    per round, the time of all prompts (each explained with its generated tokens) by inseq over ours, both
    times, whether the tokens and the matched attributions agree, and the machine."""
    rows = {}
    for model in data["models"]:
        n = len(model["prompts"])
        tokens = max(len(e["ours_generated_ids"]) for r in model["prompts"] for e in r["methods"].values())
        for method, timing in model["timing"].items():
            agreement = model["agreement"][method]
            label = INSEQ_METHODS.get(method, f"inseq `{method}`").format(**data)
            rows[f"inseq:{model['name']}:{method}"] = {
                "label": f"{label}, {INSEQ_MODELS.get(model['name'], model['name'])}, {n} SST-2 prompts × {tokens} generated tokens",
                "timing": timing,
                "agree": agreement["agree"] and agreement["prompts_with_same_tokens"] == agreement["prompts"],
                "max_abs_diff": agreement["max_abs_diff"],
                **{key: data[key] for key in ("machine", "command", "commit")},
            }
    return rows


def lrp_results(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``benchmarks/bench_lrp.py``'s result as one table row per model and method against lxt, in the
    shape of the other results (stem ``lrp:<model>:<method>``): ratio lxt / ours per round, both
    times, the agreement with lxt and the machine."""
    rows = {}
    for model in data["models"]:
        timing = model["timing"]
        for method, label in LRP_METHODS.items():
            if f"lxt_{method}" not in timing["seconds"]:
                continue
            seconds = {"ours": timing["seconds"][method], "peer": timing["seconds"][f"lxt_{method}"]}
            agreement = model["lxt"][method]
            rows[f"lrp:{model['model']}:{method}"] = {
                "label": f"{label}, {model['model']}, {model['n']} SST-2 inputs ({model['tokens']} tokens)",
                "timing": {"repeats": timing["repeats"], "seconds": seconds, "ratio": timing[f"lxt_over_ours_{method}"],
                           "load_average_before": timing["load_average_before"],
                           "load_average_after": timing["load_average_after"]},
                "agree": agreement["agree"], "max_abs_diff": agreement["max_abs_diff"],
                **{key: data[key] for key in ("machine", "command", "commit")},
            }
    return rows


def _seconds(stat: dict[str, Any]) -> str:
    """Seconds to three significant digits, trailing zeros kept (``7.00 s``, ``0.0104 s``, ``175 s``)."""

    def digits(value: float) -> str:
        return f"{value:.0f}" if value >= 100 else f"{value:#.3g}"

    return f"{digits(stat['median'])} s ({digits(stat['min'])}–{digits(stat['max'])} s)"


def _agree(data: dict[str, Any]) -> str:
    if not data.get("agree"):
        return "**no**"
    diff = data.get("max_abs_diff")
    return f"yes ({diff:.1g})" if isinstance(diff, float) and diff > 0 else "yes"


def table_rows(results: dict[str, dict[str, Any]]) -> list[str]:
    """The markdown table, one line per row whose result file exists."""
    lines = [
        "| benchmark | ratio peer / ours | ours | peer | rounds | agree | peer |",
        "|---|---|---|---|---|---|---|",
    ]
    extra = [Row(stem, results[stem]["label"], LRP_PEER) for stem in results if stem.startswith("lrp:")]
    extra += [Row(stem, results[stem]["label"], INSEQ_PEER) for stem in results if stem.startswith("inseq:")]
    extra += [Row(stem, results[stem]["label"], results[stem]["peer"]) for stem in results if stem.startswith(("perturbation:", "batched:"))]
    for row in (*ROWS, *extra):
        data = results.get(row.stem)
        if data is None:
            continue
        timing = data["timing"]
        ratio = ratio_span(timing["ratio"])
        if "cost" in timing:
            ratio += f"; our pass costs {ratio_span(timing['cost'])} the peer's"
        seconds = timing["seconds"]
        lines.append(
            f"| {row.label.format(**data, encoder_name=ENCODER_NAMES.get(data.get('encoder', ''), ''))} | {ratio} "
            f"| {_seconds(seconds['ours'])} | {_seconds(seconds['peer'])} "
            f"| {timing['repeats']} | {_agree(data)} | {row.peer} |"
        )
    return lines


def training_line(training: dict[str, Any]) -> str:
    """Tokens per second of each training setup, median (min–max)."""
    parts = [
        f"{name} {span(m['tokens_per_s'], ',.0f')} tokens/s"
        for name, m in training["models"].items()
    ]
    first = next(iter(training["models"].values()))
    return (
        f"Training throughput (`benchmarks/bench_training.py`, {training['data']} data, one epoch of "
        f"{first['batches']} batches of {first['batch_size']}, {training['timing']['repeats']} runs each, "
        f"{training['threads']} thread; no peer): "
        + "; ".join(parts) + "."
    )


def cost_line(results: dict[str, dict[str, Any]]) -> str:
    """Cost in forward-pass equivalents, ours vs peer, from the files that record it."""
    parts = []
    for stem, label in (("loo_bilstm", "leave-one-out BiLSTM"), ("loo_average", "average"), ("loo_cnn", "CNN"),
                        ("loo_transformer", "Transformer"), ("erasure", "erase-until-flip")):
        if stem in results:
            data = results[stem]
            parts.append(f"{label} {data['forward_pass_equivalents_ours']:.1f} vs {data['forward_pass_equivalents_peer']:.1f}")
    for stem in ("permutation", "adversarial"):
        if stem in results:
            model = results[stem]["forward_pass_equivalents"]
            parts.append(f"{stem} {model['ours']:,.0f} vs {model['peer']:,.0f} (modelled)")
    inputs = ""
    if "loo_bilstm" in results:
        data = results["loo_bilstm"]
        inputs = (f"Leave-one-out and gradient explain {data['inputs']}, mean length {data['mean_length']:.1f} tokens "
                  f"(models: {data['model']}). ")
    return (inputs + "Cost in forward-pass equivalents, ours vs peer (median time over the median time of one "
            "batched forward pass of the same model and inputs): " + "; ".join(parts) + ".")


def machine_line(results: dict[str, dict[str, Any]]) -> str:
    """Where and under what load the numbers were taken, and the commands that wrote them."""
    machines = [data["machine"] for data in results.values()]
    before = [data["timing"]["load_average_before"][0] for data in results.values()]
    after = [data["timing"]["load_average_after"][0] for data in results.values()]
    dates = sorted(m["date"][:10] for m in machines)
    commands = sorted({f"`{data['command']}`" for data in results.values()})
    commits = sorted({data["commit"][:10] for data in results.values()})
    cores = sorted({f"{m['cpu_count']} cores ({m['usable_cores']} usable)" for m in machines})
    torch = sorted({f"torch {m['torch_version']} with {m['torch_threads']} thread{'s' * (m['torch_threads'] != 1)}"
                    for m in machines})
    date = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
    return (
        f"Taken by {', '.join(commands)} on {date} (commit {', '.join(commits)}): {', '.join(cores)}, "
        f"{', '.join(torch)}; 1-minute load average {min(before):.2f}–{max(before):.2f} before and "
        f"{min(after):.2f}–{max(after):.2f} after the timed rounds (a load above 0 means other jobs shared the machine)."
    )


def render(results: dict[str, dict[str, Any]]) -> str:
    """The generated README block, markers included."""
    lines = [START, "", *table_rows(results), ""]
    if "training" in results:
        lines += [training_line(results["training"]), ""]
    lines += [cost_line(results), "", machine_line(results), "", END]
    return "\n".join(lines)


def _mib(value: int | None) -> str:
    return "–" if value is None else f"{value / 2**20:,.0f}" if value >= 2**20 else f"{value / 2**20:.2f}"


def llm_scale_table(data: dict[str, Any]) -> list[str]:
    """One ``bench_llm_scale`` result as a heading line, a table (one row per length) and its figure."""
    rows = [r for r in data["lengths"] if "timing" in r]
    repeats = sorted({r["timing"]["repeats"] for r in rows})
    loads = [r["timing"][key][0] for r in rows for key in ("load_average_before", "load_average_after")]
    lines = [
        f"**{data['device_name']}** ({data['device']}, {data['threads']} thread{'s' * (data['threads'] != 1)}), "
        f"{data['weights']} weights, {data['dtype']}; {'/'.join(map(str, repeats))} interleaved rounds; "
        f"1-minute load average {min(loads):.2f}–{max(loads):.2f}; `{data['command']}` "
        f"(commit {data['commit'][:10]}, {data['machine']['date'][:10]}, torch {data['machine']['torch_version']}).",
        "",
        "| T | " + " | ".join(f"{label} (s)" for _, label in LLM_TIMES) + " | capture / HF eager | peak MiB: "
        + " / ".join(label for _, label in LLM_MEMORY) + " |",
        "|---|" + "---|" * (len(LLM_TIMES) + 2),
    ]
    for r in data["lengths"]:
        seconds = r.get("timing", {}).get("seconds", {})
        cells = [_seconds(seconds[name]) if name in seconds else "skipped" for name, _ in LLM_TIMES]
        cost = ratio_span(r["timing"]["capture_cost"]) if "capture_cost" in r.get("timing", {}) else "–"
        memory = " / ".join(_mib(r.get("memory_bytes", {}).get(name)) for name, _ in LLM_MEMORY)
        lines.append(f"| {r['length']} | " + " | ".join(cells) + f" | {cost} | {memory} |")
    skipped = sorted({f"{name} at T={r['length']} ({reason})" for r in data["lengths"] for name, reason in r["skipped"].items()})
    diffs = ", ".join(f"{key.removeprefix('max_').replace('_', ' ')} {data[key]:.1g}" for key in data["tolerances"] if key in data)
    lines += ["", *streaming_line(data)]
    lines += ["", f"Agree with HF's eager forward and the all-layers rollout: {'yes' if data['agree'] else '**no**'} "
              f"(max abs {diffs})." + (f" Skipped for memory: {'; '.join(skipped)}." if skipped else ""),
              "", f"![time and peak memory against T]({TO_ROOT}benchmarks/results/{data['name']}.png)"]
    return lines


def streaming_line(data: dict[str, Any]) -> list[str]:
    """Peak memory of the streaming rollout against the all-layers one (or the capture) at the longest T measured."""
    for r in sorted(data["lengths"], key=lambda r: -r["length"]):
        memory = r.get("memory_bytes", {})
        other = next((name for name in ("rollout", "capture", "peer") if memory.get(name)), None)
        if memory.get("rollout_streaming") and other:
            label = {"rollout": "the all-layers rollout", "capture": "capturing all layers", "peer": "HF's eager forward"}[other]
            return [f"Streaming rollout at T = {r['length']}: peak {_mib(memory['rollout_streaming'])} MiB against "
                    f"{_mib(memory[other])} MiB for {label} "
                    f"({memory[other] / memory['rollout_streaming']:.0f}× less)."]
    return []


def rows_table(data: dict[str, Any]) -> list[str]:
    """One ``bench_capture_rows`` result: row-only capture against SDPA without weights, one row per length."""
    lines = [
        f"Row-only capture (every layer's weights at the predicting token, SDPA for the rest) against transformers' "
        f"SDPA forward without weights, **{data['device']}** ({data['threads']} thread{'s' * (data['threads'] != 1)}), "
        f"{data['weights']} weights, {data['dtype']}; `{data['command']}` (commit {data['commit'][:10]}, "
        f"{data['machine']['date'][:10]}); goal: {data['goal']}.",
        "",
        "| T | SDPA, no weights (s) | row-only capture (s) | capture / SDPA | logits vs SDPA | rows vs eager capture |",
        "|---|---|---|---|---|---|",
    ]
    for r in data["lengths"]:
        seconds, agreement = r["timing"]["seconds"], r["agreement"]
        lines.append(
            f"| {r['length']} | {_seconds(seconds['peer'])} | {_seconds(seconds['ours'])} | {ratio_span(r['timing']['cost'])} "
            f"| {agreement['logits_vs_sdpa']:.1g} | {agreement['weights_vs_eager_capture']:.1g} |"
        )
    return lines


def render_llm(folder: Path = RESULTS) -> str:
    """The README's decoder-LLM block (markers included) from the ``llm_scale_*.json`` and ``capture_rows_*.json``
    files that exist."""
    lines = [LLM_START, ""]
    for stem in LLM_RESULTS:
        if (folder / f"{stem}.json").exists():
            lines += [*llm_scale_table(json.loads((folder / f"{stem}.json").read_text(encoding="utf-8"))), ""]
    for stem in ROWS_RESULTS:
        if (folder / f"{stem}.json").exists():
            lines += [*rows_table(json.loads((folder / f"{stem}.json").read_text(encoding="utf-8"))), ""]
    return "\n".join([*lines, LLM_END])


ROUTES = {"interface": "attention interface", "softmax": "its own attention code (softmax intercepted)"}
LAYOUTS = {"pre": "pre-norm", "post": "post-norm", "sandwich": "sandwich norms", "parallel": "parallel attention + MLP"}


def _shortcut_sentence(rows: list[dict[str, Any]], taken: str, difference: str, what: str, others: str) -> str:
    """How many families took a shortcut (``taken`` set in their row) and its worst ``difference`` from the full pass."""
    measured = [r for r in rows if r.get(taken)]
    if not measured:
        return ""
    worst = max(r[difference] for r in measured)
    return f"{what} on {len(measured)} families against the full one{others.format(worst=worst)}, "


def rows_sentence(rows: list[dict[str, Any]]) -> str:
    """How many families computed only the explanation rows' weights (SDPA for the rest), and how close to the full pass."""
    return _shortcut_sentence(rows, "rows_only_layers", "rows",
                              "the row-only capture (SDPA for the outputs, the explanation row's weights alone)",
                              " (≤ {worst:.1g}; the others keep eager for every row)")


def cut_sentence(rows: list[dict[str, Any]]) -> str:
    """How many families run a logits-only pass's last block tail at the read rows alone, and how close to the full pass."""
    return _shortcut_sentence(rows, "read_cut", "logits_only",
                              "the logits-only pass (the last block after its attention at the read row alone)",
                              ", logits and input gradients (≤ {worst:.1g} relative; the others run the whole block)")


def render_models(folder: Path = RESULTS) -> str:
    """The README's models block from ``architectures.json`` (:mod:`benchmarks.architecture_matrix`): how many
    families of each kind pass every check, and which explanation methods apply, grouped by route and layout."""
    data = json.loads((folder / "architectures.json").read_text(encoding="utf-8"))
    rows = data["architectures"]
    lines = [
        MODELS_START, "",
        f"Generated from `benchmarks/results/architectures.json` (`{data['reproduce']}`): a tiny random model of each "
        f"family, checked against transformers' own eager forward ({', '.join(data['checks'])}; ≤ {data['tolerance']:g}), "
        + rows_sentence(rows) + cut_sentence(rows) + "then explained and audited from a saved folder.", "",
        "| kind | pass | architectures |", "|---|---|---|",
    ]
    for kind, counts in data["summary"].items():
        names = ", ".join(r["model_type"] for r in rows if r["kind"] == kind)
        lines.append(f"| {kind} | {counts['passed']} of {counts['total']} | {names} |")
    lines += ["", "| attention reached through | block layout | explanation methods that do not apply | architectures |", "|---|---|---|---|"]
    groups: dict[tuple[str, str, str], list[str]] = {}
    for row in rows:
        if row["kind"] == "encoder-decoder":
            continue
        layouts = [LAYOUTS.get(name, "not found") for name in row["layouts"]]
        missing = ", ".join(sorted(name for name, reason in row["methods"].items() if reason)) or "none"
        key = (ROUTES[row["route"]], " / ".join(dict.fromkeys(layouts)), missing)
        groups.setdefault(key, []).append(row["model_type"])
    for (route, layout, missing), names in groups.items():
        lines.append(f"| {route} | {layout} | {missing} | {', '.join(names)} |")
    if any(row["methods"].get("input_gradient") for row in rows):  # appended to the opening paragraph: the README is short
        lines[2] += (" Methods are listed with their default options: `input_gradient` is listed where every path from the input "
                     "embeddings passes a LayerNorm, so its default `|Σ_d ∂z/∂e|` is 0 up to rounding; with `--reduction l2` it applies "
                     "([reductions](docs/sections/explain.md)).")
    return "\n".join([*lines, "", MODELS_END])


def replace_block(readme: str, block: str, start_marker: str = START, end_marker: str = END) -> str:
    """``readme`` with the text from ``start_marker`` to ``end_marker`` (inclusive) replaced by ``block``."""
    start, end = readme.find(start_marker), readme.find(end_marker)
    if start < 0 or end < start:
        raise SystemExit(f"{README}: no {start_marker} ... {end_marker} block")
    return readme[:start] + block + readme[end + len(end_marker):]


def updated_page(page: str) -> str:
    """The benchmark page with its benchmark table rewritten (and the decoder-LLM block where it has its markers)."""
    from benchmarks import long_context_table

    text = replace_block(page, render(load()))
    if long_context_table.START in text:
        text = replace_block(text, long_context_table.render(), long_context_table.START, long_context_table.END)
    return replace_block(text, render_llm(), LLM_START, LLM_END) if LLM_START in text else text


def updated_readme(readme: str) -> str:
    """The README with its models block rewritten, where it has its markers."""
    return replace_block(readme, render_models(), MODELS_START, MODELS_END) if MODELS_START in readme else readme


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a generated block is stale")
    args = parser.parse_args(argv)
    stale = []
    for path, update in ((PAGE, updated_page), (README, updated_readme)):
        text = path.read_text(encoding="utf-8")
        updated = update(text)
        if updated == text:
            continue
        stale.append(path)
        if not args.check:
            from attnaudit.io import atomic_write_text

            atomic_write_text(path, updated)
    if args.check and stale:
        print(f"{', '.join(map(str, stale))}: a generated table differs from benchmarks/results; run python -m benchmarks.table")
        return 1
    if not args.check:
        print(render(load()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
