"""The faithfulness scoreboard (ERASER metrics for every registered explanation) on fine-tuned MiniLM, SST-2.

1. Fine-tune the embedded all-MiniLM-L6-v2 on ``--finetune-limit`` SST-2 training phrases with
   the settings of ``benchmarks/reproduce_minilm.py`` (a finished run is reused), or take
   ``--run``, a run made by ``attnaudit finetune``.
2. Cost model: on the first ``--profile`` GLUE-dev sentences, the CPU seconds of every
   explanation method and of the batched perturbations per removal mode (process CPU time, so
   other jobs on the machine inflate it less than wall time), extrapolated to ``--limit``.
3. ``attnaudit run faithfulness`` on the first ``--limit`` GLUE-dev sentences (our ``sst2``
   test split) with ``--methods`` (default: every registered method that applies) and ``--mode``.
4. Plausibility: the same on the first ``--plausibility`` sentences of the SST treebank's test
   split (``sst-trees``: phrase-level rationales), for AUPRC and token F1 (deletion at one bin, 20 %, only).
5. The same on an SST BiLSTM run (``--bilstm``, J&W setup) and our own Transformer on SST
   (``--transformer``), on ``--other-limit`` SST test sentences; each skipped when absent.
6. ``--parts smollm2``: the embedded SmolLM2-135M-Instruct zero-shot (``--hf smollm2 --task sst2``)
   on the first ``--smollm2-limit`` GLUE-dev sentences with ``--smollm2-methods``, deletion, the AOPC
   bins and no curve. A finished ``attnaudit run faithfulness`` result in its folder
   (``benchmarks/runs/scoreboard-smollm2``) with the same options is read instead of run again.

Writes ``benchmarks/results/scoreboard.json`` (``--name``; ``--parts`` runs some of the scoreboards; command, commit, cores, load average before and
after, wall and CPU seconds, the scoreboards). Run:
``nice -n 5 .venv/bin/python benchmarks/reproduce_scoreboard.py --data-dir ../shared/data``.
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

from attnaudit.experiments import run_test  # noqa: E402
from attnaudit.experiments.eraser_metrics import BINS, MODES, perturbation_probs  # noqa: E402
from attnaudit.experiments.faithfulness import grid  # noqa: E402
from attnaudit.explain import list_explanations  # noqa: E402
from attnaudit.hf import load_hf  # noqa: E402
from attnaudit.io import read_json  # noqa: E402
from attnaudit.models.hf import HF_DIR  # noqa: E402
from attnaudit.run import Run, load_run  # noqa: E402
from benchmarks.common import RUNS, add_limit_order, write_result  # noqa: E402

SMOLLM2_METHODS = "attnlrp,cp_lrp,attention,rollout,alti,globenc,norms,input_gradient,gradient,loo,random"
KEEP = ("mode", "method", "aopc_comp", "aopc_comp_low", "aopc_comp_high", "aopc_suff", "aopc_suff_low",
        "aopc_suff_high", "deletion", "insertion", "auprc", "auprc_low", "auprc_high", "token_f1",
        "token_f1_low", "token_f1_high", "rank_aopc_comp", "n")


def tuned_run(args: argparse.Namespace) -> Run:
    """The fine-tuned MiniLM: ``--run``, else fine-tuned here (reused when finished)."""
    if args.run:
        return load_run(args.run, device="cpu", data_dir=args.data_dir)
    from attnaudit.training.finetune import finetune

    out = RUNS / f"minilm-sst2-{args.finetune_limit}"
    return finetune("sst2", out, hf="minilm", epochs=1, lr=5e-5, batch_size=16, limit=args.finetune_limit, seed=0,
                    data_dir=args.data_dir, device="cpu", max_len=128)


def cost_model(run: Run, sentences: int, methods: list[str], modes: list[str], data_dir: str) -> dict[str, Any]:
    """CPU seconds per sentence of each explanation and of the perturbations per mode, on ``sentences`` sentences."""
    batch = run.collate(run.examples("test", sentences, data_dir=data_dir))
    chosen = {m.name: m for m in list_explanations(run) if m.name in methods}
    explain, scores = {}, {}
    for name, method in chosen.items():
        tic = time.process_time()
        scores[name] = method(run.model, batch, steps=20, seed=0).detach().double()
        explain[name] = (time.process_time() - tic) / sentences
    perturb = {}
    for mode in modes:
        tic = time.process_time()
        perturbation_probs(run.model, batch, scores, grid(list(BINS), 10), mode)  # type: ignore[arg-type]
        perturb[mode] = (time.process_time() - tic) / sentences
    return {"sentences": sentences, "explain_cpu_s_per_sentence": explain, "perturb_cpu_s_per_sentence": perturb,
            "total_cpu_s_per_sentence": sum(explain.values()) + sum(perturb.values())}


def scoreboard(run: Run, args: argparse.Namespace, out: Path, limit: int, mode: str, methods: str = "", **extra: Any) -> dict[str, Any]:
    """``attnaudit run faithfulness`` on ``run`` (``extra``: more of its options); the ranked table, wall and CPU seconds."""
    options: dict[str, Any] = {"methods": methods.split(",")} if methods else {}
    options.update(batch_size=args.batch_size, **extra)
    load = os.getloadavg()
    wall, cpu = time.perf_counter(), time.process_time()
    result = run_test("faithfulness", run, split="test", limit=limit, out=out, seed=0, mode=mode, limit_order=args.limit_order, **options)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return from_result({"summary": result.summary, "meta": result.meta, "tables": result.tables}, out, wall, cpu,
                       list(load), list(os.getloadavg()))


def from_result(result: dict[str, Any], out: Path, wall: float, cpu: float | None, before: list[float], after: list[float]) -> dict[str, Any]:
    """The parts of a faithfulness result (its JSON layout) that the scoreboard tables use, with the cost."""
    return {
        "n": result["summary"]["n"], "excluded_short": result["summary"]["excluded_short"], "subset": result["meta"].get("subset"),
        "methods": result["meta"]["methods"], "filler": result["meta"]["filler"],
        "scoreboard": [{k: row.get(k) for k in KEEP} for row in result["tables"]["scoreboard"]],
        "agreement": result["tables"]["agreement"],
        "wall_seconds": wall, "cpu_seconds": cpu, "load_before": before, "load_after": after, "results": str(out),
    }


def smollm2(args: argparse.Namespace) -> dict[str, Any]:
    """SmolLM2 zero-shot on GLUE dev, deletion, AOPC bins, no curve; a finished result with the same
    options in its folder is read instead (its wall seconds are the run's own; CPU seconds unknown)."""
    out = RUNS / "scoreboard-smollm2"
    methods = args.smollm2_methods.split(",")
    options = {"methods": methods, "mode": "delete", "curve_steps": 0, "bins": list(BINS), "batch_size": args.batch_size}
    finished = out / "faithfulness.json"
    if finished.is_file():
        result = read_json(finished)
        meta = result["meta"]
        if meta["limit"] == args.smollm2_limit and all(meta["options"].get(k) == v for k, v in options.items()):
            return {"run": "--hf smollm2 --task sst2", "read_from": str(finished),
                    **from_result(result, out, meta["seconds"], None, [], [])}
    run = load_hf("smollm2", task="sst2", data_dir=args.data_dir, device="cpu")
    board = scoreboard(run, args, out, args.smollm2_limit, "delete", args.smollm2_methods, curve_steps=0)
    return {"run": "--hf smollm2 --task sst2", **board}


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--run", help="a fine-tuned MiniLM run to reuse (attnaudit finetune --task sst2 ...)")
    parser.add_argument("--finetune-limit", type=int, default=4000, help="SST-2 phrases to fine-tune on")
    parser.add_argument("--limit", type=int, default=500, help="GLUE-dev sentences to score")
    parser.add_argument("--methods", default="", help="comma-separated; default every registered method that applies")
    parser.add_argument("--mode", default="both", choices=[*MODES, "both"])
    parser.add_argument("--profile", type=int, default=32, help="sentences for the per-method cost model (0: none)")
    parser.add_argument("--plausibility", type=int, default=200, help="SST treebank test sentences for AUPRC / token F1 (0: none)")
    parser.add_argument("--bilstm", default=str(RUNS / "sst-bilstm"), help="an SST BiLSTM run (skipped when absent)")
    parser.add_argument("--transformer", default=str(RUNS / "sst-transformer"), help="our Transformer on SST (skipped when absent)")
    parser.add_argument("--other-limit", type=int, default=300, help="SST test sentences for the BiLSTM and the Transformer")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32, help="instances per batch (smaller: less memory, e.g. for IG)")
    parser.add_argument("--parts", default="minilm,bilstm,transformer",
                        help="which scoreboards to run (minilm includes the plausibility run); separate invocations can run in parallel")
    parser.add_argument("--name", default="scoreboard", help="result file stem: benchmarks/results/NAME.json")
    parser.add_argument("--smollm2-limit", type=int, default=100, help="GLUE-dev sentences for SmolLM2 zero-shot")
    parser.add_argument("--smollm2-methods", default=SMOLLM2_METHODS, help="the methods scored on SmolLM2 (IG is left out: cost)")
    add_limit_order(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    parts = args.parts.split(",")
    result: dict[str, Any] = {"threads": args.threads}
    if "minilm" in parts:
        minilm(args, result)
    if "smollm2" in parts:
        result["smollm2"] = smollm2(args)
        write_result(args.name, result)
    for key, path in (("sst_bilstm", args.bilstm), ("sst_transformer", args.transformer)):
        if key.removeprefix("sst_") in parts and Path(path, "config.json").is_file():
            other = load_run(path, device="cpu", data_dir=args.data_dir)
            accuracy = read_json(Path(path) / "metrics.json")["test"].get("accuracy")
            board = scoreboard(other, args, RUNS / f"scoreboard-{key.replace('_', '-')}", args.other_limit, args.mode)
            result[key] = {"run": path, "test_accuracy": accuracy, "scoreboard": board}
            write_result(args.name, result)
    result["seconds"] = time.perf_counter() - start
    write_result(args.name, result)
    boards = {k: v["scoreboard"] if isinstance(v["scoreboard"], dict) else v
              for k, v in result.items() if isinstance(v, dict) and "scoreboard" in v}
    print({k: (board["n"], round(board["wall_seconds"], 1)) for k, board in boards.items()})
    return result


def minilm(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """The fine-tuned MiniLM's scoreboard (and cost model), then its plausibility on SST treebank sentences."""
    run = tuned_run(args)
    metrics = read_json(Path(run.path) / "metrics.json")
    methods = args.methods.split(",") if args.methods else [m.name for m in list_explanations(run)]
    modes = list(MODES) if args.mode == "both" else [args.mode]
    result["minilm"] = {"run": str(run.path), "glue_dev_accuracy": metrics["test"].get("accuracy"),
                        "train_examples": metrics.get("train_examples")}
    if args.profile:
        result["minilm"]["cost_model"] = cost_model(run, args.profile, methods, modes, args.data_dir)
    result["minilm"]["scoreboard"] = scoreboard(run, args, RUNS / "scoreboard-minilm", args.limit, args.mode, args.methods)
    write_result(args.name, result)  # the main board is kept even if a later part fails
    if args.plausibility:
        trees = load_hf(Path(run.path) / HF_DIR, task="sst-trees", data_dir=args.data_dir, device="cpu")
        # only AUPRC / token F1 are wanted here: one bin and no curve keep the perturbations few
        result["minilm_sst_trees"] = scoreboard(trees, args, RUNS / "scoreboard-minilm-sst-trees", args.plausibility, "delete",
                                                args.methods, bins=[20.0], curve_steps=0)
        write_result(args.name, result)


if __name__ == "__main__":
    main()
