"""The generation test on SmolLM2: the attention tests at every generated token of 100 prompts.

The prompts are ``--prompts`` GLUE SST-2 dev sentences drawn with ``--seed`` (a seeded sample, stratified by
label so neither sentiment dominates) put into ``"Review: {text}\\nIn short, the film is"``; SmolLM2-135M-Instruct
generates ``--generate`` tokens greedily after each and every token is one instance of the generation test
(permutation of the generating attention at the explained layer, erasure top vs random, erase until the token
changes, adversarial attention within ε, softmax swapped for sparsemax / entmax15, ERASER of attention and
input × gradient).

Writes ``benchmarks/results/generation_smollm2.json`` (the summary, the wall time, the prompt file's digest);
the prompt file and the result folder go to ``benchmarks/runs/`` (git-ignored).
Run: ``nice -n 5 .venv/bin/python -m benchmarks.reproduce_generation --data-dir ../shared/data``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks.common` when run as a script

from attnaudit.data.subsets import limited  # noqa: E402
from attnaudit.data.tasks import load_task  # noqa: E402
from attnaudit.experiments import run_test  # noqa: E402
from attnaudit.hf import load_hf  # noqa: E402
from attnaudit.io import atomic_write  # noqa: E402
from benchmarks.common import RUNS, write_result  # noqa: E402

TEMPLATE = "Review: {text}\nIn short, the film is"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--prompts", type=int, default=100, help="how many SST-2 dev sentences")
    parser.add_argument("--generate", type=int, default=5)
    parser.add_argument("--permutations", type=int, default=20)
    parser.add_argument("--adversaries", type=int, default=3)
    parser.add_argument("--adversary-steps", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    data = load_task("sst2", data_dir=args.data_dir)
    chosen = limited(data.test, args.prompts, args.seed)
    lines = "".join(json.dumps({"prompt": TEMPLATE.replace("{text}", " ".join(ex.tokens))}) + "\n" for ex in chosen)
    prompts = RUNS / "generation-prompts.jsonl"
    atomic_write(prompts, lambda tmp: tmp.write_text(lines))
    start = time.perf_counter()
    run = load_hf("smollm2")
    loaded = time.perf_counter()
    result = run_test("generation", run, out=RUNS / "generation-smollm2", seed=args.seed, prompts=str(prompts),
                      generate=args.generate, permutations=args.permutations, adversaries=args.adversaries,
                      adversary_steps=args.adversary_steps)
    done = time.perf_counter()
    labels = {label: sum(ex.label == label for ex in chosen) for label in sorted({str(ex.label) for ex in chosen})}
    write_result("generation_smollm2", {
        "command": " ".join(["python -m benchmarks.reproduce_generation", *sys.argv[1:]]),
        "prompts": {"count": len(chosen), "labels": labels, "template": TEMPLATE,
                    "sha256": hashlib.sha256(lines.encode()).hexdigest()},
        "options": {"generate": args.generate, "permutations": args.permutations, "adversaries": args.adversaries,
                    "adversary_steps": args.adversary_steps, "seed": args.seed, "threads": args.threads},
        "seconds": {"load": round(loaded - start, 1), "test": round(done - loaded, 1), "total": round(done - start, 1)},
        "summary": result.summary,
    })
    print(json.dumps({"seconds": round(done - start, 1), **{k: v for k, v in result.summary.items() if not k.endswith("_ci")}}, indent=1))


if __name__ == "__main__":
    main()
