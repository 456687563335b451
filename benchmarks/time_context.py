"""Per-prompt seconds of the context test before and after a change, in interleaved rounds (issue #45 item 4).

Two worker processes load SmolLM2-135M-Instruct once each: one imports attnaudit from this checkout's ``src``, the
other from ``--before`` (a git ref, its ``src`` extracted with ``git archive`` to a temporary folder). Every round asks
each in turn (the order alternating between rounds, :func:`benchmarks.common.time_interleaved`) to run the test's whole
per-question work (``context.prompt_rows``: render, generate, attention, gradient, leave-one-out, ContextCite) on the
same ``--prompts`` bAbI-1 test questions, the first of :func:`benchmarks.reproduce_context.stratified_order`; one
untimed warm-up call each first. The two sides' sentence scores and per-question rows are compared (the largest
absolute difference per method; whether every top sentence and hit is the same).
Writes ``benchmarks/results/context_speed_smollm2.json``.
Run: ``nice -n 10 env OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.time_context --data-dir ../shared/data --before REF``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks.common` when run as a script

from benchmarks.common import ROOT, commit, headline, time_interleaved, write_result  # noqa: E402

NAME = "context_speed_smollm2"
METHODS = ("attention", "attention_top_heads", "input_x_gradient", "loo", "contextcite")


def worker(args: argparse.Namespace) -> None:
    """Serve ``run`` lines on stdin: score the chosen questions, answer one JSON line (seconds, rows, scores)."""
    import torch

    from attnaudit.experiments import context
    from attnaudit.experiments.experiment import get_experiment
    from attnaudit.experiments.runner import make_options
    from attnaudit.hf import load_hf
    from attnaudit.progress import set_quiet
    from benchmarks.reproduce_context import stratified_order

    torch.set_num_threads(1)
    set_quiet(True)
    run = load_hf("smollm2", task="babi1", data_dir=args.data_dir, device="cpu")
    examples = run.examples("test", data_dir=args.data_dir)
    chosen = stratified_order([str(e.label) for e in examples], args.seed)[: args.prompts]
    options = make_options(get_experiment("context"), {"generate": args.generate, "ablations": args.ablations, "heads": args.heads})
    model = run.model
    print(json.dumps({"ready": context.__file__, "chosen": chosen}), flush=True)
    for _line in sys.stdin:
        start = time.perf_counter()
        with model.unverbalized(), model.next_token_decision():
            out = [context.prompt_rows(model, examples[i], i, options, args.seed) for i in chosen]
        seconds = time.perf_counter() - start
        print(json.dumps({"seconds": seconds, "rows": [row for row, _ in out], "tables": [table for _, table in out]}), flush=True)


class Worker:
    """One worker process importing attnaudit from ``src``."""

    def __init__(self, src: Path, args: argparse.Namespace) -> None:
        env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--data-dir", args.data_dir, "--prompts", str(args.prompts),
                   "--generate", str(args.generate), "--ablations", str(args.ablations), "--heads", str(args.heads), "--seed", str(args.seed)]
        self.process = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ready = self._answer()
        if not str(self.ready["ready"]).startswith(str(src)):
            raise SystemExit(f"the worker imported {self.ready['ready']}, not the code under {src}")
        self.last: dict[str, Any] = {}

    def _answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit("a worker ended early")
        return dict(json.loads(line))

    def __call__(self) -> float:
        assert self.process.stdin is not None
        self.process.stdin.write("run\n")
        self.process.stdin.flush()
        self.last = self._answer()
        return float(self.last["seconds"])

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait()


def agreement(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The largest absolute difference of each method's sentence scores, of ``answer_logp``, and whether the answers
    and every method's top sentence, hit and recall are the same."""
    pairs = [(b, a) for tb, ta in zip(before["tables"], after["tables"]) for b, a in zip(tb, ta)]
    rows = list(zip(before["rows"], after["rows"]))
    same = all(b["answer"] == a["answer"] and all(b[f"{m}_{k}"] == a[f"{m}_{k}"] for m in METHODS for k in ("top", "top1", "recall"))
               for b, a in rows)
    return {
        "max_abs_difference": {m: max(abs(b[m] - a[m]) for b, a in pairs) for m in METHODS},
        "max_abs_difference_answer_logp": max(abs(b["answer_logp"] - a["answer_logp"]) for b, a in rows),
        "same_answers_tops_hits_and_recalls": same,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--before", default="", help="the git ref whose src is timed as 'before'")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=3, help="bAbI-1 questions per call (the first of the stratified order)")
    parser.add_argument("--generate", type=int, default=6)
    parser.add_argument("--ablations", type=int, default=16)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if not args.before:
        raise SystemExit("--before REF is needed: the git ref timed as 'before'")
    before_commit = subprocess.run(["git", "rev-parse", args.before], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as folder:
        archive = subprocess.run(["git", "archive", before_commit, "src"], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
        sides = {"before": Worker(Path(folder) / "src", args), "after": Worker(ROOT / "src", args)}
        try:
            record, _ = time_interleaved(dict(sides), args.rounds, ratios={"ratio": ("before", "after")})
        finally:
            for side in sides.values():
                side.close()
    per_prompt = {side: {k: (round(v / args.prompts, 2) if k != "runs" else [round(x / args.prompts, 2) for x in v])
                         for k, v in record["seconds"][side].items()} for side in sides}
    write_result(NAME, {
        "command": " ".join(["python -m benchmarks.time_context", *sys.argv[1:]]),
        "code_commit": commit(),
        "before_commit": before_commit,
        "model": "SmolLM2-135M-Instruct (embedded, float32, CPU, one thread)",
        "questions": {"task": "babi1", "indices": sides["after"].ready["chosen"], "sentences": [r["sentences"] for r in sides["after"].last["rows"]],
                      "prompt_tokens": [r["prompt_tokens"] for r in sides["after"].last["rows"]],
                      "answer_tokens": [r["answer_tokens"] for r in sides["after"].last["rows"]]},
        "options": {"generate": args.generate, "ablations": args.ablations, "heads": args.heads, "seed": args.seed},
        "timing": record,
        "per_prompt_seconds": per_prompt,
        **headline(record, ours="after", peer="before"),  # ratio: before / after seconds per round (the speedup)
        "agreement": agreement(sides["before"].last, sides["after"].last),
    })
    print(json.dumps({"per_prompt_seconds": {s: v["median"] for s, v in per_prompt.items()}, "speedup": record["ratio"]["median"]}))


if __name__ == "__main__":
    main()
