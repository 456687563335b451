"""``python -m benchmarks.table``: write the README's benchmark table from ``benchmarks/results/*.json``.

Everything between ``<!-- bench-table:start -->`` and ``<!-- bench-table:end -->`` in README.md
is generated here: one row per speed benchmark (ratio peer / ours and both times as median
(min–max) over the interleaved rounds of :func:`benchmarks.common.time_interleaved`), the
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
START = "<!-- bench-table:start -->"
END = "<!-- bench-table:end -->"
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
    Row("llm_captum", "Integrated Gradients, SmolLM2 zero-shot, {n} SST-2 prompts × {steps} steps",
        "Captum `LayerIntegratedGradients` on HF's model"),
)


def load(folder: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """Every result file of :data:`ROWS` and ``training.json`` that exists, by stem."""
    stems = [row.stem for row in ROWS] + ["training"]
    return {stem: json.loads((folder / f"{stem}.json").read_text(encoding="utf-8"))
            for stem in stems if (folder / f"{stem}.json").exists()}


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
    for row in ROWS:
        data = results.get(row.stem)
        if data is None:
            continue
        timing = data["timing"]
        ratio = ratio_span(timing["ratio"])
        if "cost" in timing:
            ratio += f"; our pass costs {ratio_span(timing['cost'])} the peer's"
        seconds = timing["seconds"]
        lines.append(
            f"| {row.label.format(**data, encoder_name=ENCODER_NAMES.get(data.get('encoder', ''), ''))} | {ratio} | {_seconds(seconds['ours'])} | {_seconds(seconds['peer'])} "
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


def replace_block(readme: str, block: str) -> str:
    """``readme`` with the text from START to END (inclusive) replaced by ``block``."""
    start, end = readme.find(START), readme.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{README}: no {START} ... {END} block")
    return readme[:start] + block + readme[end + len(END):]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when README.md is stale")
    args = parser.parse_args(argv)
    readme = README.read_text(encoding="utf-8")
    updated = replace_block(readme, render(load()))
    if args.check:
        if updated != readme:
            print(f"{README}: benchmark table differs from benchmarks/results; run python -m benchmarks.table")
            return 1
        return 0
    if updated != readme:
        from attnaudit.io import atomic_write_text

        atomic_write_text(README, updated)
    print(render(load()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
