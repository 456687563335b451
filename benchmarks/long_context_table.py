"""The long-context table of the benchmark page, generated from ``benchmarks/results/long_context.json``
(:mod:`benchmarks.bench_long_context`) between ``<!-- long-context-table:start -->`` and ``<!-- long-context-table:end -->``
by ``python -m benchmarks.table``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS

START = "<!-- long-context-table:start -->"
END = "<!-- long-context-table:end -->"
LABELS = {
    "hf_forward": "transformers forward (SDPA, logits at every position)",
    "hf_forward_last": "transformers forward (SDPA, `logits_to_keep=1`)",
    "ours_attention": "attnaudit `explain --method attention`",
    "ours_gradient": "attnaudit `explain --method gradient`",
    "ours_input_gradient": "attnaudit `explain --method input_gradient` (probability, L2)",
    "inseq_attention": "inseq 0.7.1 `attention`",
    "inseq_saliency": "inseq 0.7.1 `saliency`",
}


def cell(answer: dict[str, Any], ratio: dict[str, float] | None) -> str:
    """``peak MB (× the HF forward's), seconds`` or how the case failed."""
    if "failed" in answer:
        return answer["failed"]
    times = "" if ratio is None else f" ({ratio['peak_rss_mb']:.2f}×)"
    return f"{answer['peak_rss_mb']:,.0f} MB{times}, {answer['seconds']:.3g} s"


def render(path: Path = RESULTS / "long_context.json") -> str:
    """The block: one row per case, one column per length; where the result is absent, a line saying so."""
    if not path.is_file():
        return "\n".join([START, "", "(no `benchmarks/results/long_context.json` yet: run `python -m benchmarks.bench_long_context`)", "", END])
    data = json.loads(path.read_text(encoding="utf-8"))
    rows = data["lengths"]
    head = "| case | " + " | ".join(f"T = {row['tokens']:,}" for row in rows) + " |"
    lines = [START, "", head, "|" + "---|" * (len(rows) + 1)]
    for case in data["cases"]:
        cells = [cell(row["cases"][case], row["ratio_to_hf_forward"].get(case)) if case in row["cases"] else "not run" for row in rows]
        lines.append(f"| {LABELS.get(case, case)} | " + " | ".join(cells) + " |")
    parts = data.get("parts") or [data]
    commands = ", ".join(f"`{part['command']}`" for part in parts)
    commits = ", ".join(sorted({str(part["commit"])[:10] for part in parts}))
    loads = [value for part in parts for value in part.get("load_average", [])[:1]]
    worst = data.get("ours_worst_peak_ratio")
    lines += [
        "",
        f"Peak resident memory of a fresh process per case (loading included; × the transformers forward's at the same T) and "
        f"the operation's time, one run each (a memory measurement: the times are single runs, not a speed claim), one thread, "
        f"address space capped at {data['cap_gb']:g} GiB. Worst ratio of ours: "
        f"{'n/a' if worst is None else f'{worst:.2f}×'} (goal ≤ 1.3×). Taken by {commands} (commit {commits}; 1-minute load "
        f"average {min(loads, default=0):.1f}–{max(loads, default=0):.1f} when written).",
        "",
        END,
    ]
    return "\n".join(lines)
