"""Reproduce Jain & Wallace (2019)'s attention-vs-importance correlations on SST (BiLSTM).

Trains ``train("sst", "bilstm", ..., preset="jain-wallace")`` — their protocol: 8 fixed epochs,
the best dev ROC-AUC epoch kept (never the first), no dropout, AMSGrad, weight decay 1e-5 on
all but the attention scorer, no clipping, summed loss, ``<s> … </s>`` around every sentence
(never attention items), sentences under 6 tokens removed — once per seed into
``benchmarks/runs/jw-preset-seed<N>`` (gitignored; reused when already trained), with MiniLM's
static input embeddings as word vectors (their fastText/word2vec vectors are not available
offline). For every seed it runs the ``importance`` test on the whole SST test split with the
selected epoch, and (``--epoch-limit N``) on the first N test sentences with every epoch's
weights; each mean τ and significant fraction gets a seeded bootstrap 95% CI over sentences.
Writes ``benchmarks/results/jw_importance.json`` (after every seed, so a cut-short call keeps
what it finished) with the mean over seeds beside J&W's figures. Slow (minutes per seed).
Run: ``.venv/bin/python benchmarks/reproduce_jw_importance.py [--data-dir ../shared/data] [--seeds 0,1,2]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from attnaudit.experiments.importance import PUBLISHED, pair_name
from attnaudit.experiments.runner import run_test
from attnaudit.io import atomic_write_json, read_json
from attnaudit.run import Run, load_run
from attnaudit.training.checkpoint import load_state_into
from attnaudit.training.trainer import EPOCHS, PRESETS, train

HERE = Path(__file__).resolve().parent
RESULT = HERE / "results" / "jw_importance.json"
RUNS = HERE / "runs"
PRESET = "jain-wallace"
PAIRS = [pair_name("attention", "gradient"), pair_name("attention", "loo"), pair_name("gradient", "loo")]


def _commit() -> str:
    """The checked-out commit, or "uncommitted" outside a repository or before the first commit."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "uncommitted"


def _ci(values: np.ndarray, statistic: Any, seed: int, resamples: int) -> list[float]:
    """Seeded percentile bootstrap 95% CI of ``statistic`` over sentences (scipy.stats.bootstrap)."""
    if len(values) < 2:
        return [float("nan"), float("nan")]
    ci = stats.bootstrap((values,), statistic, n_resamples=resamples, method="percentile",
                         random_state=np.random.default_rng(seed)).confidence_interval
    return [float(ci.low), float(ci.high)]


def pair_stats(instances: list[dict[str, Any]], seed: int, resamples: int) -> dict[str, dict[str, Any]]:
    """Per pair: mean ± sd of τ, the fraction significant (p ≤ 0.05), and bootstrap CIs of both."""
    out = {}
    for pair in PAIRS:
        taus = np.array([r[f"tau_{pair}"] for r in instances], dtype=float)
        ps = np.array([r[f"p_{pair}"] for r in instances], dtype=float)
        finite = np.isfinite(taus)
        tau, significant = taus[finite], (ps[np.isfinite(ps)] <= 0.05).astype(float)
        out[pair] = {
            "mean": float(tau.mean()), "std": float(tau.std(ddof=1)), "n": int(finite.sum()), "n_nan": int((~finite).sum()),
            "mean_ci95": _ci(tau, np.mean, seed, resamples),
            "significant": float(significant.mean()), "significant_ci95": _ci(significant, np.mean, seed, resamples),
        }
    return out


def importance(
    run: Run, data_dir: Path, methods: list[str], limit: int | None, seed: int, resamples: int, limit_order: str = "stratified"
) -> dict[str, Any]:
    """The importance test on the test split (first ``limit`` sentences), summarised per pair."""
    result = run_test("importance", run, split="test", data_dir=data_dir, methods=methods, limit=limit, seed=seed, limit_order=limit_order)
    return {"n": result.summary["n"], "excluded_short": result.summary["excluded_short"],
            "pairs": pair_stats(result.instances, seed, resamples)}


def one_seed(seed: int, args: argparse.Namespace, methods: list[str], given: Path | None = None) -> dict[str, Any]:
    """Train (or reload) one seed with the preset — or load the ``given`` run — then τ on the
    selected epoch, and per epoch when the run kept its epochs."""
    start = time.perf_counter()
    if given is None:
        out = args.out_dir / f"jw-preset-seed{seed}"
        run = train("sst", "bilstm", out, data_dir=args.data_dir, preset=PRESET, seed=seed, vectors=args.vectors,
                    keep_epochs=True)
    else:
        out, run = given, load_run(given, data_dir=args.data_dir)
        seed = int(run.info.get("train", {}).get("seed", 0))
    train_or_load = time.perf_counter() - start
    metrics = read_json(out / "metrics.json")
    start = time.perf_counter()
    selected = importance(run, args.data_dir, methods, None, seed, args.bootstrap)
    record: dict[str, Any] = {
        "seed": seed, "run": str(out), "selected_epoch": metrics.get("training", {}).get("selected_epoch", metrics.get("epochs")),
        "setting": {"model": run.info.get("model"), "train": run.info.get("train"), "task": run.info.get("task")},
        "test_accuracy": metrics["test"]["accuracy"], "test_roc_auc": metrics["test"].get("roc_auc"),
        "dev_roc_auc": metrics["dev"].get("roc_auc"), "dev_accuracy": metrics["dev"]["accuracy"],
        "history": [{"epoch": h["epoch"], "train_loss": h["train_loss"], **{f"dev_{k}": v for k, v in h["dev"].items()}}
                    for h in metrics["history"]],
        "selected": selected, "train_seconds": metrics.get("train_seconds"),
        "train_or_load_seconds": train_or_load, "test_seconds": time.perf_counter() - start,
        "notes": metrics.get("notes", []),
    }
    record["per_epoch"] = per_epoch(run, out, args, methods, seed) if args.epoch_limit else None
    record["full_epochs"] = {e: epoch_full(run, out, e, args, methods, seed) for e in args.full_epochs}
    return record


def epoch_full(run: Run, out: Path, epoch: int, args: argparse.Namespace, methods: list[str], seed: int) -> dict[str, Any]:
    """Test accuracy and τ on the whole test split with epoch ``epoch``'s kept weights."""
    from attnaudit.training.trainer import evaluate_examples

    load_state_into(run.model, out / EPOCHS / f"epoch{epoch}.safetensors")
    run.model.eval()
    scores = evaluate_examples(run, run.examples("test", data_dir=args.data_dir))
    row = {"test_accuracy": scores["accuracy"], **importance(run, args.data_dir, methods, None, seed, args.bootstrap)}
    load_state_into(run.model, out / "model.safetensors")
    return row


def per_epoch(run: Run, out: Path, args: argparse.Namespace, methods: list[str], seed: int) -> list[dict[str, Any]] | None:
    """τ on the first ``--epoch-limit`` test sentences with each kept epoch's weights (None if none were kept)."""
    files = sorted((out / EPOCHS).glob("epoch*.safetensors"), key=lambda p: int(p.stem.removeprefix("epoch")))
    if not files:
        return None
    rows = []
    for path in files:
        load_state_into(run.model, path)
        run.model.eval()
        from attnaudit.training.trainer import evaluate_examples

        scores = evaluate_examples(run, run.examples("test", data_dir=args.data_dir))
        rows.append({"epoch": int(path.stem.removeprefix("epoch")), "test_accuracy": scores["accuracy"],
                     **importance(run, args.data_dir, methods, args.epoch_limit, seed, args.bootstrap, args.limit_order)})
    load_state_into(run.model, out / "model.safetensors")
    return rows


def over_seeds(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and sd over seeds of test accuracy and each pair's mean τ / significant fraction (selected epochs)."""
    def ms(values: list[float]) -> dict[str, float]:
        array = np.array(values, dtype=float)
        return {"mean": float(array.mean()), "std": float(array.std(ddof=1)) if len(array) > 1 else float("nan")}

    out: dict[str, Any] = {"seeds": [r["seed"] for r in records], "test_accuracy": ms([r["test_accuracy"] for r in records])}
    for pair in PAIRS:
        rows = [r["selected"]["pairs"][pair] for r in records]
        out[pair] = {"tau_mean": ms([row["mean"] for row in rows]), "tau_sd_within": ms([row["std"] for row in rows]),
                     "significant": ms([row["significant"] for row in rows])}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_data = os.environ.get("ATTNAUDIT_DATA", str(HERE.parent.parent / "shared" / "data"))
    parser.add_argument("--data-dir", type=Path, default=Path(default_data), help="real data directory")
    parser.add_argument("--out-dir", type=Path, default=RUNS, help="folder of the per-seed run directories")
    parser.add_argument("--seeds", default="0,1,2", help="training seeds (comma-separated)")
    parser.add_argument("--vectors", default="minilm", help="word vectors (J&W used fastText/word2vec)")
    parser.add_argument("--methods", default="gradient,loo", help="importance methods (comma-separated)")
    parser.add_argument("--epoch-limit", type=int, default=200, help="test sentences for per-epoch τ (0: skip)")
    parser.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples for the 95%% CIs")
    parser.add_argument("--run", type=Path, action="append", help="evaluate this trained run instead of training (repeatable)")
    parser.add_argument("--result", type=Path, default=RESULT, help="JSON to write")
    parser.add_argument("--full-epochs", default="", help="also τ on the whole test set with these epochs' weights (e.g. 8)")
    parser.add_argument("--table", action="store_true", help="print the README table of --result and stop")
    parser.add_argument("--limit-order", default="stratified", choices=("stratified", "first"),
                        help="how --epoch-limit chooses its sentences: stratified by label (seeded) or the first N")
    args = parser.parse_args(argv)
    if args.table:
        print(markdown(read_json(args.result)))
        return read_json(args.result)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    args.full_epochs = [int(e) for e in args.full_epochs.split(",") if e.strip()]
    jobs: list[tuple[int, Path | None]] = [(0, r) for r in args.run] if args.run else [(s, None) for s in seeds]
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]

    start = time.perf_counter()
    records: list[dict[str, Any]] = []
    out: dict[str, Any] = {}
    for seed, given in jobs:
        records.append(one_seed(seed, args, methods, given))
        out = {
            "name": "jw_importance", "preset": None if args.run else PRESET,
            "preset_settings": None if args.run else PRESETS[PRESET], "vectors": args.vectors,
            "mean_over_seeds": over_seeds(records), "per_seed": records, "published": PUBLISHED,
            "per_epoch_sentences": args.epoch_limit or None, "bootstrap_resamples": args.bootstrap,
            "wall_seconds": time.perf_counter() - start,
            "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
            "commit": _commit(), "cores": os.cpu_count(), "loadavg": os.getloadavg(),
        }
        atomic_write_json(args.result, out)
        _print(records[-1])
    summary = out["mean_over_seeds"]
    for pair in PAIRS:
        print(f"mean over seeds {pair:24s} τ {summary[pair]['tau_mean']['mean']:.3f} ± {summary[pair]['tau_mean']['std']:.3f}"
              f" (sig {summary[pair]['significant']['mean']:.2f})   J&W {PUBLISHED.get(pair)}")
    print(f"-> {args.result}")
    return out


def markdown(result: dict[str, Any]) -> str:
    """The README table of a result JSON: per seed, the mean over seeds, and J&W's figures."""
    def cell(row: dict[str, Any], significant: bool = True) -> str:
        text = f"{row['mean']:.3f} ± {row['std']:.3f} [{row['mean_ci95'][0]:.3f}, {row['mean_ci95'][1]:.3f}]"
        return text + (f", {row['significant']:.0%} sig. [{row['significant_ci95'][0]:.0%}, {row['significant_ci95'][1]:.0%}]"
                       if significant else "")

    lines = ["| seed (kept epoch) | test acc. | τ(att, grad) mean ± sd [95% CI], significant | τ(att, LOO) | τ(grad, LOO) |",
             "|---|---|---|---|---|"]
    for r in result["per_seed"]:
        p = r["selected"]["pairs"]
        lines.append(f"| {r['seed']} ({r['selected_epoch']}) | {r['test_accuracy']:.4f} | {cell(p[PAIRS[0]])} | "
                     f"{cell(p[PAIRS[1]], False)} | {cell(p[PAIRS[2]], False)} |")
    m = result["mean_over_seeds"]

    def over(pair: str) -> str:
        spread = m[pair]["tau_mean"]["std"]
        spread = "—" if spread is None or spread != spread else f"{spread:.3f}"  # one seed: no sd
        return f"{m[pair]['tau_mean']['mean']:.3f} (sd over seeds {spread}; within {m[pair]['tau_sd_within']['mean']:.3f})"

    lines.append(f"| mean over {len(m['seeds'])} seeds | {m['test_accuracy']['mean']:.4f} | {over(PAIRS[0])}, "
                 f"{m[PAIRS[0]]['significant']['mean']:.0%} sig. | {over(PAIRS[1])} | {over(PAIRS[2])} |")
    lines.append("| Jain & Wallace (2019) | — | 0.351 ± 0.211, 49% sig. | 0.291 ± 0.191 | 0.656 |")
    seeds = [r for r in result["per_seed"] if r.get("per_epoch")]
    if seeds:
        lines += ["", f"Per epoch, first {result['per_epoch_sentences']} test sentences: test accuracy / τ(att, grad) / "
                  "τ(att, LOO) / τ(grad, LOO) (* = kept epoch)", "",
                  "| epoch | " + " | ".join(f"seed {r['seed']}" for r in seeds) + " |", "|---|" + "---|" * len(seeds)]
        for i in range(max(len(r["per_epoch"]) for r in seeds)):
            cells = []
            for r in seeds:
                e = r["per_epoch"][i] if i < len(r["per_epoch"]) else None
                cells.append("" if e is None else f"{e['test_accuracy']:.3f} / " + " / ".join(
                    f"{e['pairs'][p]['mean']:.3f}" for p in PAIRS) + (" *" if e["epoch"] == r["selected_epoch"] else ""))
            lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _print(record: dict[str, Any]) -> None:
    pairs = record["selected"]["pairs"]
    print(f"seed {record['seed']}: epoch {record['selected_epoch']}, test accuracy {record['test_accuracy']:.4f}, " + "; ".join(
        f"{p} {pairs[p]['mean']:.3f} ± {pairs[p]['std']:.3f} [{pairs[p]['mean_ci95'][0]:.3f}, {pairs[p]['mean_ci95'][1]:.3f}]"
        f" sig {pairs[p]['significant']:.2f}" for p in PAIRS), flush=True)


if __name__ == "__main__":
    main()
