"""The context test on SmolLM2-135M-Instruct: is attention a faithful context tracer of bAbI answers?

For each bAbI task of ``--tasks`` a seeded sample of ``--limit`` test questions, stratified by answer (the runner's
``--limit``), is rendered with SmolLM2's own chat template; the model generates its answer and every context
sentence is scored by attention (all heads; the top ``--heads`` heads), input × gradient, leave-one-out and
ContextCite (``--ablations`` seeded random ablations), against the supporting facts and the leave-one-out effect.

Writes ``benchmarks/results/context_smollm2.json`` after each task (command, commit, sample, seconds, summary);
the result folders go to ``benchmarks/runs/`` (git-ignored). ``--docs`` only rewrites the generated table of
``docs/sections/context.md`` from that JSON.
Run: ``nice -n 10 env OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.reproduce_context --data-dir ../shared/data``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks.common` when run as a script

from benchmarks.common import RESULTS, RUNS, commit, write_result  # noqa: E402

NAME = "context_smollm2"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "sections" / "context.md"
METHODS = ("chance", "attention", "attention_top_heads", "input_x_gradient", "loo", "contextcite")


def measure(args: argparse.Namespace) -> None:
    import torch

    from attnaudit.experiments import run_test
    from attnaudit.hf import load_hf

    torch.set_num_threads(args.threads)
    code = commit()  # the code measured (``commit`` in the JSON is the checkout's when the file was last written)
    tasks: dict[str, Any] = {}
    for task in args.tasks.split(","):
        start = time.perf_counter()
        run = load_hf("smollm2", task=task, data_dir=args.data_dir, device="cpu")
        loaded = time.perf_counter()
        result = run_test("context", run, out=RUNS / f"context-smollm2-{task}", limit=args.limit, seed=args.seed, data_dir=args.data_dir,
                          generate=args.generate, ablations=args.ablations, heads=args.heads, resamples=args.resamples)
        done = time.perf_counter()
        prompts = max(1, int(result.summary["prompts"]))
        tasks[task] = {
            "subset": result.meta.get("subset"),
            "seconds": {"load": round(loaded - start, 1), "test": round(done - loaded, 1), "per_prompt": round((done - loaded) / prompts, 1)},
            "summary": result.summary,
            "notes": result.meta.get("notes", []),
        }
        write_result(NAME, {
            "command": " ".join(["python -m benchmarks.reproduce_context", *sys.argv[1:]]),
            "code_commit": code,
            "model": "SmolLM2-135M-Instruct (embedded, float32, CPU)",
            "options": {"limit": args.limit, "generate": args.generate, "ablations": args.ablations, "heads": args.heads,
                        "resamples": args.resamples, "seed": args.seed, "threads": args.threads},
            "tasks": tasks,
        })
        print(json.dumps({task: {k: v for k, v in result.summary.items() if not k.endswith("_ci")}}, indent=1), flush=True)


def cell(summary: dict[str, Any], key: str) -> str:
    value, ci = summary.get(key), summary.get(f"{key}_ci")
    if not isinstance(value, (int, float)) or value != value:
        return "–"
    return f"{value:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]" if isinstance(ci, list) and ci[0] == ci[0] else f"{value:.2f}"


def table(data: dict[str, Any]) -> str:
    """The docs table: per task and subset, each method's top-1 hit, recall at k and ρ with the LOO effect (95 % CIs)."""
    lines = []
    for task, entry in data["tasks"].items():
        summary = entry["summary"]
        lines += [f"**{task}**: {summary['prompts']} questions, answer accuracy {cell(summary, 'accuracy')} "
                  f"({summary['correct_prompts']} correct); {entry['seconds']['per_prompt']} s per question.", "",
                  "| method | top-1 hit, all | recall@k, all | ρ with LOO, all | top = 1st sentence, all | top-1 hit, correct | recall@k, correct "
                  "| ρ with LOO, correct |", "|---|---|---|---|---|---|---|---|"]
        for method in METHODS:
            cells = [cell(summary, f"{method}_{measure}_{subset}") for subset in ("all", "correct")
                     for measure in ("top1", "recall", "spearman", "first") if subset == "all" or measure != "first"]
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def docs() -> None:
    data = json.loads((RESULTS / f"{NAME}.json").read_text())
    text = DOCS.read_text()
    start, end = "<!-- context_smollm2:start -->\n", "<!-- context_smollm2:end -->"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    DOCS.write_text(pattern.sub(lambda _m: start + table(data) + end, text))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--tasks", default="babi1", help="comma-separated: babi1, babi2, babi3")
    parser.add_argument("--limit", type=int, default=12, help="questions per task (a seeded sample stratified by answer)")
    parser.add_argument("--generate", type=int, default=6)
    parser.add_argument("--ablations", type=int, default=16)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--docs", action="store_true", help="only rewrite the docs table from the JSON")
    args = parser.parse_args()
    if args.docs:
        docs()
    else:
        measure(args)


if __name__ == "__main__":
    main()
