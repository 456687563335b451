"""The context test on SmolLM2-135M-Instruct: is attention a faithful context tracer of bAbI answers?

For each bAbI task of ``--tasks`` the test questions are taken in one seeded order stratified by answer (each
answer's questions shuffled and interleaved by their share, :func:`stratified_order`, so that every prefix of the
order is a stratified sample), rendered with SmolLM2's own chat template; the model generates its answer and every
context sentence is scored by attention (all heads; the top ``--heads`` heads), input × gradient, leave-one-out and
ContextCite (``--ablations`` seeded random ablations), against the supporting facts and the leave-one-out effect.

Each task runs for at most its ``--minutes`` (and ``--limit`` questions): questions are scored one by one until its
time is spent, so the questions measured are the first N of the order. ``benchmarks/results/context_smollm2.json``
(command, commit, sample, seconds, summary) is rewritten every ``--write-every`` seconds and after each task, so a
cut-short run still leaves its results; the per-question rows go to ``benchmarks/runs/`` (git-ignored). ``--docs``
only rewrites the generated table of ``docs/sections/context.md`` from that JSON (and the per-prompt seconds before
and after, from ``context_speed_smollm2.json``: ``benchmarks/time_context.py``).
Run: ``nice -n 10 env OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.reproduce_context --data-dir ../shared/data``.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks.common` when run as a script

from attnaudit.io import atomic_write_json  # noqa: E402
from benchmarks.common import RESULTS, RUNS, commit, write_result  # noqa: E402

NAME = "context_smollm2"
SPEED = "context_speed_smollm2"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "sections" / "context.md"
METHODS = ("chance", "attention", "attention_top_heads", "input_x_gradient", "loo", "contextcite")


def stratified_order(labels: list[str], seed: int) -> list[int]:
    """Every index of ``labels`` once, in an order whose every prefix is (up to rounding) a sample stratified by label:
    each label's indices in a seeded random order, the ``k``-th of a label with ``n`` indices at ``(k + 0.5) / n``."""
    rng = random.Random(seed)
    groups: dict[str, list[int]] = {}
    for index, label in enumerate(labels):
        groups.setdefault(label, []).append(index)
    keyed = []
    for label in sorted(groups):
        members = groups[label][:]
        rng.shuffle(members)
        keyed += [((k + 0.5) / len(members), label, index) for k, index in enumerate(members)]
    return [index for *_, index in sorted(keyed)]


def measure_task(args: argparse.Namespace, task: str, minutes: float, write: Any) -> dict[str, Any]:
    """Score ``task``'s questions in :func:`stratified_order` until ``minutes`` or ``--limit`` run out; ``write(entry)``
    is called with the task's entry every ``--write-every`` seconds and at the end."""
    from attnaudit.experiments.experiment import get_experiment
    from attnaudit.experiments.runner import make_options
    from attnaudit.hf import load_hf
    from attnaudit.progress import set_quiet
    from attnaudit.seed import set_seed

    set_quiet(True)
    set_seed(args.seed)
    experiment = get_experiment("context")
    options = make_options(experiment, {"generate": args.generate, "ablations": args.ablations, "heads": args.heads,
                                        "resamples": args.resamples})
    start = time.perf_counter()
    run = load_hf("smollm2", task=task, data_dir=args.data_dir, device="cpu")
    examples = run.examples("test", data_dir=args.data_dir)
    order = stratified_order([str(e.label) for e in examples], args.seed)[: args.limit]
    loaded = time.perf_counter()
    parts, done, written = [], [], loaded
    entry: dict[str, Any] = {}
    for position, index in enumerate(order):
        parts.append(experiment.part(run, [examples[index]], options, args.seed, [index]))
        done.append(index)
        now = time.perf_counter()
        last = position == len(order) - 1 or now - loaded >= minutes * 60
        if last or now - written >= args.write_every:
            result = experiment.merge(run, parts, options, args.seed)
            labels = Counter(str(examples[i].label) for i in done)
            entry = {
                "subset": {"split": "test", "n": len(done), "of": len(examples), "seed": args.seed,
                           "chosen": "the first n of a seeded order stratified by answer (every prefix proportional to the answers' shares)",
                           "labels": dict(sorted(labels.items())), "complete": len(done) == len(order)},
                "seconds": {"load": round(loaded - start, 1), "test": round(now - loaded, 1),
                            "per_prompt": round((now - loaded) / len(done), 1)},
                "summary": result.summary,
                "notes": result.meta.get("notes", []),
            }
            write(entry)
            atomic_write_json(RUNS / f"context-smollm2-{task}.json", {"instances": result.instances})
            written = time.perf_counter()
        if last:
            break
    return entry


def measure(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    code = commit()  # the code measured (``commit`` in the JSON is the checkout's when the file was last written)
    tasks: dict[str, Any] = {}
    names = args.tasks.split(",")
    minutes = [float(m) for m in args.minutes.split(",")] if args.minutes else [float("inf")] * len(names)
    if len(minutes) != len(names):
        raise SystemExit(f"--minutes gives {len(minutes)} budgets for {len(names)} tasks")
    for task, budget in zip(names, minutes):

        def write(entry: dict[str, Any], task: str = task) -> None:
            tasks[task] = entry
            write_result(NAME, {
                "command": " ".join(["python -m benchmarks.reproduce_context", *sys.argv[1:]]),
                "code_commit": code,
                "model": "SmolLM2-135M-Instruct (embedded, float32, CPU)",
                "options": {"limit": args.limit, "minutes": args.minutes, "generate": args.generate, "ablations": args.ablations,
                            "heads": args.heads, "resamples": args.resamples, "seed": args.seed, "threads": args.threads},
                "tasks": tasks,
            })

        try:
            entry = measure_task(args, task, budget, write)
        except Exception as error:  # one task's failure leaves the others' results (and says why)
            entry = {**tasks.get(task, {}), "error": f"{type(error).__name__}: {error}"}
            write(entry)
        print(json.dumps({task: {k: v for k, v in entry.get("summary", {}).items() if not k.endswith("_ci")}}, indent=1), flush=True)


def cell(summary: dict[str, Any], key: str) -> str:
    value, ci = summary.get(key), summary.get(f"{key}_ci")
    if not isinstance(value, (int, float)) or value != value:
        return "–"
    if isinstance(ci, list) and all(isinstance(c, (int, float)) and c == c for c in ci):
        return f"{value:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]"
    return f"{value:.2f}"


def speed_line(speed: dict[str, Any]) -> str:
    """The per-question seconds before and after the lean ablation passes, from ``context_speed_smollm2.json``."""
    before, after = speed["per_prompt_seconds"]["before"], speed["per_prompt_seconds"]["after"]
    ratio = speed["timing"]["ratio"]
    questions = speed["questions"]
    return (f"Per question (`python -m benchmarks.time_context`, {speed['timing']['repeats']} interleaved rounds on "
            f"{len(questions['indices'])} bAbI-1 questions of {', '.join(map(str, questions['sentences']))} sentences, one thread; "
            f"median [min, max]): {before['median']:.1f} s [{before['min']:.1f}, {before['max']:.1f}] at commit "
            f"{speed['before_commit'][:7]}, {after['median']:.1f} s [{after['min']:.1f}, {after['max']:.1f}] now, "
            f"{ratio['median']:.2f}× [{ratio['min']:.2f}, {ratio['max']:.2f}] faster (load average "
            f"{speed['timing']['load_average_before'][0]} before, {speed['timing']['load_average_after'][0]} after); the sentence "
            f"scores agree to {max(speed['agreement']['max_abs_difference'].values()):.0e} "
            f"(same answers, top sentences and hits: {speed['agreement']['same_answers_tops_hits_and_recalls']}).")


def table(data: dict[str, Any], speed: dict[str, Any] | None = None) -> str:
    """The docs table: per task and subset, each method's top-1 hit, recall at k and ρ with the LOO effect (95 % CIs);
    and the per-question seconds before and after (``speed``) when measured."""
    lines = []
    for task, entry in data["tasks"].items():
        summary, subset = entry["summary"], entry.get("subset") or {}
        sample = (f"{subset['n']} of the {subset['of']} test questions (the first of the seeded order stratified by answer)"
                  if "of" in subset and "chosen" in subset and "first" in subset["chosen"] else f"{summary['prompts']} questions")
        lines += [f"**{task}**: {sample}, answer accuracy {cell(summary, 'accuracy')} "
                  f"({summary['correct_prompts']} correct); {entry['seconds']['per_prompt']} s per question.", "",
                  "| method | top-1 hit, all | recall@k, all | ρ with LOO, all | top = 1st sentence, all | top-1 hit, correct | recall@k, correct "
                  "| ρ with LOO, correct |", "|---|---|---|---|---|---|---|---|"]
        for method in METHODS:
            cells = [cell(summary, f"{method}_{measure}_{subset}") for subset in ("all", "correct")
                     for measure in ("top1", "recall", "spearman", "first") if subset == "all" or measure != "first"]
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        lines.append("")
    if speed is not None:
        lines += [speed_line(speed), ""]
    return "\n".join(lines).rstrip() + "\n"


def results() -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The result JSON and, where measured, the before/after timing's."""
    speed = RESULTS / f"{SPEED}.json"
    return json.loads((RESULTS / f"{NAME}.json").read_text()), json.loads(speed.read_text()) if speed.exists() else None


def docs() -> None:
    text = DOCS.read_text()
    start, end = "<!-- context_smollm2:start -->\n", "<!-- context_smollm2:end -->"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    DOCS.write_text(pattern.sub(lambda _m: start + table(*results()) + end, text))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--tasks", default="babi1", help="comma-separated: babi1, babi2, babi3")
    parser.add_argument("--limit", type=int, default=None, help="at most this many questions per task (default: all)")
    parser.add_argument("--minutes", default="", help="comma-separated: each task's time budget in minutes (default: none)")
    parser.add_argument("--write-every", type=float, default=120.0, help="seconds between rewrites of the JSON")
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
