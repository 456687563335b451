"""Reproduce Madsen et al. (2022)'s Recursive-ROAR RACU for the BiLSTM-attention model on SST and bAbI-1.

Per task: trains the base run with Madsen et al.'s protocol (``--preset madsen2022-sst`` / ``madsen2022-babi``:
BiLSTM 128 per direction, additive tanh attention, AMSGrad lr 1e-3, weight decay 1e-5 off the attention; SST 8
epochs of 32, best dev ROC-AUC; bAbI 100 epochs of 50, random 50-d embeddings, best dev accuracy, and, as their
``experiments/babi.py``, 32 units, weight decay on every parameter and their pair model's head) into
``benchmarks/runs/roar-<task>`` (gitignored; reused when trained), then runs the ``roar`` test with
``--recursive`` over the seeds (the base run's seed 0, then 1, 2, ...; each seed its own 0 % model), ratios
10 … 90 and the methods attention, gradient, input_gradient, ig, scoring macro-F1 (SST) or accuracy (bAbI) on
the masked test split as they do. Every retrain is a checkpointed sub-run, so a cut-short call resumes where it
stopped. Writes ``benchmarks/results/<name>.json`` (after every task) with ours beside their published RACU.

Their four measures, as their code defines them (``nlproar/explain/importance_measures``), are ours with options
(:data:`MEASURES`), all explaining the gold label's logit (``--explain gold``) with the attention live:
``gradient`` ``‖∂z_y/∂x‖₂`` is ``input_gradient`` with ``reduction=l2, score=logit``; ``input_gradient`` (x ⊙ ∇)
``|Σ_d ∂z_y/∂e·e|`` is ``gradient`` with ``attention=live, score=logit``; ``ig`` ``|1/n Σ_i α_i ∂z_y/∂e(α_i e)·e|``
(zero baseline, ``α_i = i/n``, ``n = 50``: their code takes the gradient with respect to the unscaled embedding, so
each step's gradient is weighted by ``α_i``) is ``ig`` with ``score=logit, rule=riemann_right, weight=scale``.
Results keep their names. ``--explain predicted`` asks the same measures for the class each step's model predicts
instead (not their protocol: whether the gold label travels in the masks); its curves have folders of their own
(no ``-gold``), so both read from one ROAR folder, each reporting the other's among ``other_curves``.
``--so-far`` also reports every other complete curve in the folder (``other_curves``: an earlier definition of a
measure, such as Integrated Gradients proper, ``ig-score-logit-gold-recursive``).

Differences we know of: their SST vectors (fastText simple.300d) are not available offline, so SST embeddings
start random (300-d), where theirs start from the vectors and every word fastText lacks starts at zero
(``--vectors minilm`` starts the base and every retrain from MiniLM's static vectors instead: pretrained, not
fastText; its runs go to folders of their own, ``roar-<task>-vectors-<name>``); their
length filter (``len(ex.text) > 5``) counts the treebank's tokens, punctuation included, ours (``--min-length 6``)
the words of Jain & Wallace's file, so we keep fewer sentences (6,356 training sentences against 6,579); their
gradient's norm is over the one-hot input, ``‖∂z/∂e · Eᵀ‖₂`` (``E`` the embedding matrix), ours over the embedding,
``‖∂z/∂e‖₂``: the same ranking when ``EᵀE`` is a multiple of the identity, which random embeddings nearly are
(``benchmarks/roar_gradient_norm.py`` measures it; ``benchmarks/roar_ig_path.py`` measures how far their IG and the
integral rank words alike). On bAbI their dev split is 15 % of the training questions (8,500 / 1,500 of en-10k), ours
10 % (9,000 / 1,000), and their story joins its sentences with full stops and drops the last one's, where ours keeps
every sentence's (one token more per story).

Full run: hours on 2 cores (4 methods × 9 ratios + random + 100 % = 46 retrains per seed and task).
``--limit N --seeds 1 --ratios 50 --epochs 1 --name roar_smoke`` proves the pipeline end to end in a minute.
Run: ``.venv/bin/python benchmarks/reproduce_roar.py [--data-dir ../shared/data] [--tasks sst,babi1] [--seeds 5]``
(``--engine ray --workers N``: the curves of one seed trained side by side, as the ``roar`` test does on Ray).
``--so-far`` trains nothing: it reads the sub-runs finished so far (a run still under way, or cut short) and writes
``benchmarks/results/<name>_so_far.json`` with the RACU of every (seed, method) whose curve and random baseline are
complete, marked partial, which retrains are still missing, the finished points of the curves still under way
(``unfinished_points``; every point, a complete curve's in ``curves`` too, with its ``train_seconds``) and each seed's
finished 0 % and 100 % scores (``anchors``),
and how many retrains the RACU rests on and how long they trained (``training``: their ``train_seconds`` summed, as
measured where each ran).

A ledger carries the finished work from one machine to the next: ``--so-far`` (and every finished task) writes
``benchmarks/results/<name>_ledger.json`` with the config and scores of every complete curve and 100 % model (no
weights, no masks, no per-epoch history; one line; the data folder written as ``DATA``), and a run first restores the entries its folder lacks as
sub-runs known by their scores alone, which ROAR reads instead of retraining (each entry's own config hash is checked
with the data folder put back: one written with the data elsewhere is skipped). A curve cut short is not in it: its
next ratio needs the weights of the last, so it starts again. Nor are the 0 % models, whose weights the recursive
curves start from: on a new machine a run (not ``--so-far``, which only reads) restores the ledger and retrains them
first (a few minutes each, one thread: they come back with the same scores to the last digit).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnaudit.algorithms.racu import mean_interval, racu  # noqa: E402
from attnaudit.data.subsets import limited  # noqa: E402
from attnaudit.data.tasks import load_task  # noqa: E402
from attnaudit.experiments.roar import curve_name  # noqa: E402
from attnaudit.experiments.runner import run_test  # noqa: E402
from attnaudit.explain.registry import EXPLANATIONS  # noqa: E402
from attnaudit.io import atomic_write_json, read_json  # noqa: E402
from attnaudit.run import Run  # noqa: E402
from attnaudit.training.adversary import config_hash  # noqa: E402
from attnaudit.training.trainer import train  # noqa: E402
from benchmarks.common import RESULTS, ROOT, RUNS, write_result  # noqa: E402

METHODS = ["attention", "gradient", "input_gradient", "ig"]
MEASURES: dict[str, tuple[str, dict[str, str]]] = {  # their measure: our method and its options (the module docstring)
    "attention": ("attention", {}),
    "gradient": ("input_gradient", {"reduction": "l2", "score": "logit"}),
    "input_gradient": ("gradient", {"attention": "live", "score": "logit"}),
    "ig": ("ig", {"score": "logit", "rule": "riemann_right", "weight": "scale"}),
}
PROTOCOL = {"sst": ("madsen2022-sst", "macro_f1"), "babi1": ("madsen2022-babi", "accuracy"),
            "babi2": ("madsen2022-babi", "accuracy"), "babi3": ("madsen2022-babi", "accuracy")}
PUBLISHED = {  # RACU %, mean (95 % CI over 5 seeds), LSTM, Recursive ROAR: Madsen et al. 2022 (the authors' poster)
    "sst": {"attention": (15.7, 13.3, 18.1), "gradient": (7.6, 5.6, 9.9), "input_gradient": (28.0, 23.6, 33.6), "ig": (37.8, 32.5, 42.4)},
    "babi1": {"attention": (66.5, 57.3, 75.7), "gradient": (66.1, 59.6, 72.0), "input_gradient": (71.2, 67.0, 75.2), "ig": (59.1, 51.7, 65.9)},
    "babi2": {"attention": (75.4, 67.3, 80.3), "gradient": (66.3, 61.2, 70.5), "input_gradient": (66.7, 54.3, 74.7), "ig": (34.6, 19.8, 48.0)},
    "babi3": {"attention": (77.7, 69.6, 87.3), "gradient": (73.0, 65.4, 82.1), "input_gradient": (53.9, 29.8, 64.6), "ig": (25.9, 16.8, 34.4)},
}


def base_folder(task: str, args: argparse.Namespace) -> Path:
    """The task's base run folder: ``roar-<task>``, with ``-limit<N>`` and ``-vectors-<name>`` where they apply."""
    suffix = f"-limit{args.limit}" if args.limit else ""
    if args.vectors:
        suffix += "-vectors-" + "".join(c if c.isalnum() else "-" for c in Path(args.vectors.removeprefix("hf:")).name)
    return args.runs / f"roar-{task}{suffix}"


def base_run(task: str, args: argparse.Namespace) -> Run:
    """The task's base run with the Madsen preset (``--limit``: each split cut to a stratified sample; ``--vectors``:
    the embeddings start from those pretrained vectors, and so does every retrain)."""
    preset, _ = PROTOCOL[task]
    out = base_folder(task, args)
    options: dict[str, Any] = {"preset": preset, "seed": 0, "epochs": args.epochs, "vectors": args.vectors}
    if not args.limit:
        return train(task, "bilstm", out, data_dir=args.data_dir, **options)
    data = load_task(task, data_dir=args.data_dir)
    data = replace(data, **{s: limited(data.split(s), args.limit, 0) for s in ("train", "dev", "test")})
    run = train(data, "bilstm", out, **options)
    return replace(run, _data=data)  # a reloaded run would read the whole task from its spec


def roar_root(task: str, args: argparse.Namespace) -> Path:
    """The folder of ``task``'s ROAR sub-runs (``seed-<s>/<name>/ratio-<k>``)."""
    base = base_folder(task, args)
    return base.with_name(base.name + "-roar") / "subruns" / "roar"


def _finished(folder: Path) -> bool:
    return (folder / "metrics.json").is_file() and (folder / "config.json").is_file()


def measure_folder(measure: str, explain: str = "gold") -> str:
    """The curve folder (per seed) of one of their measures: our method with its options, the class ``explain`` names
    (theirs: gold), recursive."""
    method, settings = MEASURES[measure]
    return curve_name(EXPLANATIONS[method], settings, gold=explain == "gold", recursive=True)


def curve_folder(method: str, explain: str = "gold") -> str:
    """The folder of one curve (per seed): ``random``'s own, or one of their measures' (:func:`measure_folder`)."""
    return method if method == "random" else measure_folder(method, explain)


def roar_options(measures: list[str], explain: str = "gold") -> dict[str, Any]:
    """The ``roar`` test's options for their ``measures``: our methods, their options, the class explained (theirs: gold)."""
    return {"methods": [MEASURES[m][0] for m in measures], "explain": explain,
            "method_options": [f"{MEASURES[m][0]}.{k}={v}" for m in measures for k, v in MEASURES[m][1].items()]}


LEFT_OUT = ("history",)
"""What the ledger leaves out of a retrain's ``metrics.json``: the per-epoch history (most of its size; the curves,
RACU and restoring read only the scores)."""


def ledger_entries(task: str, args: argparse.Namespace) -> dict[str, Any]:
    """The config and scores of every complete curve (each ratio finished) and 100 % model of ``task``, by folder
    relative to :func:`roar_root`; the data folder written as ``DATA``."""
    root, data = roar_root(task, args), str(Path(args.data_dir).resolve())
    entries: dict[str, Any] = {}
    for seed in range(args.seeds):
        folders = [root / f"seed-{seed}" / "all" / "ratio-100"]
        names = sorted(p.name for p in (root / f"seed-{seed}").glob("*") if p.is_dir() and p.name not in ("all", "unmasked"))
        for name in names:  # every curve, also of measures defined otherwise before (kept, as finished work)
            curve = [root / f"seed-{seed}" / name / f"ratio-{r}" for r in args.ratios]
            folders += curve if all(_finished(f) for f in curve) else []
        for folder in filter(_finished, folders):
            config = read_json(folder / "config.json")
            if config.get("task", {}).get("data_dir") == data:
                config["task"]["data_dir"] = "DATA"
            metrics = {k: v for k, v in read_json(folder / "metrics.json").items() if k not in LEFT_OUT}
            entries[folder.relative_to(root).as_posix()] = {"config": config, "metrics": metrics}
    return entries


def write_ledger(tasks: list[str], args: argparse.Namespace) -> Path:
    """``benchmarks/results/<name>_ledger.json``: the ledger entries of ``tasks``, beside those of other tasks already in it."""
    path = RESULTS / f"{args.name}_ledger.json"
    kept = read_json(path).get("tasks", {}) if path.exists() else {}
    return write_result(f"{args.name}_ledger", {"tasks": {**kept, **{t: ledger_entries(t, args) for t in tasks}}}, indent=None)


def restore_ledger(task: str, args: argparse.Namespace) -> int:
    """Write the ledger's entries of ``task`` that its folder lacks (config, then ``metrics.json``, no weights); the number written."""
    path = RESULTS / f"{args.name}_ledger.json"
    entries = read_json(path).get("tasks", {}).get(task, {}) if path.exists() else {}
    root, data, restored = roar_root(task, args), str(Path(args.data_dir).resolve()), 0
    for where, entry in entries.items():
        folder, config = root / where, entry["config"]
        if config.get("task", {}).get("data_dir") == "DATA":
            config["task"]["data_dir"] = data
        if _finished(folder) or config_hash(config) != config.get("hash"):
            continue  # there already, or written with the data in another folder (the hash would not match)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(folder / "config.json", config)
        atomic_write_json(folder / "metrics.json", entry["metrics"])
        restored += 1
    return restored


def one_task(task: str, args: argparse.Namespace) -> dict[str, Any]:
    """Base run, Recursive ROAR and the comparison with the published RACU for ``task``."""
    start = time.perf_counter()
    restored = restore_ledger(task, args)
    if restored:
        print(f"{task}: {restored} finished retrains restored from {args.name}_ledger.json (scores only)", flush=True)
    run = base_run(task, args)
    base_seconds = time.perf_counter() - start
    _, metric = PROTOCOL[task]
    out = Path(run.path or ".").with_name(Path(run.path or ".").name + "-roar")
    start = time.perf_counter()
    result = run_test(
        "roar", run, out=out, data_dir=args.data_dir, ratios=args.ratios, recursive=True, seeds=args.seeds, epochs=args.epochs,
        metric=metric, engine=args.engine, workers=args.workers, together=args.together, **roar_options(args.methods, args.explain),
    )
    roar_seconds = time.perf_counter() - start
    base_metrics = read_json(Path(run.path or ".") / "metrics.json")
    theirs = {MEASURES[m][0]: m for m in args.methods}  # our method -> their measure's name
    rows = []
    for row in result.tables["racu_summary"]:
        measure = theirs[row["method"]]
        paper = PUBLISHED[task].get(measure)
        inside = paper is not None and paper[1] <= row["racu"] <= paper[2]
        rows.append({**row, "method": measure, "ours": row["method"], "options": MEASURES[measure][1], "explain": args.explain,
                     "published": paper and {"racu": paper[0], "low": paper[1], "high": paper[2]}, "within_published_ci": inside})
    curves = [{**r, "method": theirs.get(r["method"], r["method"])} for r in result.tables["curves"]]
    return {
        "task": task, "preset": PROTOCOL[task][0], "vectors": args.vectors, "metric": metric, "limit": args.limit,
        "epochs": args.epochs or "preset",
        "seeds": args.seeds, "ratios": args.ratios, "methods": args.methods,
        "base": {"dev": base_metrics["dev"], "test": base_metrics["test"], "train_seconds": base_metrics.get("train_seconds")},
        "racu": rows, "curves": curves, "notes": result.meta.get("notes", []),
        "figures": result.figures, "wall_seconds": {"base": round(base_seconds, 1), "roar": round(roar_seconds, 1)},
    }


def finished_score(folder: Path, metric: str) -> float | None:
    """The test ``metric`` of a finished sub-run (its ``metrics.json`` is written last), else None."""
    path = folder / "metrics.json"
    return float(read_json(path)["test"][metric]) if path.exists() else None


def train_seconds(folder: Path) -> float | None:
    """How long a finished sub-run trained, as measured where it ran (None: not recorded, as in an older ledger's)."""
    seconds = read_json(folder / "metrics.json").get("train_seconds")
    return None if seconds is None else float(seconds)


def training_time(folders: list[Path]) -> dict[str, Any]:
    """How many retrains ``folders`` are and how long they trained (their ``train_seconds`` summed; a run restored
    from an older ledger without it is counted in ``retrains`` but not in ``timed``)."""
    seconds = [train_seconds(f) for f in folders]
    timed = [float(s) for s in seconds if s is not None]
    return {"retrains": len(folders), "timed": len(timed), "train_hours": sum(timed) / 3600}


def so_far(task: str, args: argparse.Namespace) -> dict[str, Any]:
    """The RACU of the curves finished so far in ``task``'s ROAR folder, training nothing (``--so-far``)."""
    _, metric = PROTOCOL[task]
    base = base_folder(task, args)
    root = roar_root(task, args)
    rows, per_seed, missing, used, unfinished, anchors = [], [], [], [], [], []

    def zero_folder(seed: int) -> Path:  # the seed's 0 % model: the base run for seed 0
        return base if seed == 0 else root / f"seed-{seed}" / "unmasked"

    def point_folder(seed: int, method: str, ratio: int) -> Path:  # the model behind one point of a curve
        if ratio in (0, 100):
            return zero_folder(seed) if ratio == 0 else root / f"seed-{seed}" / "all" / "ratio-100"
        return root / f"seed-{seed}" / curve_folder(method, args.explain) / f"ratio-{ratio}"

    for seed in range(args.seeds):
        zero = finished_score(zero_folder(seed), metric)
        full = finished_score(root / f"seed-{seed}" / "all" / "ratio-100", metric)
        if zero is not None or full is not None:
            anchors.append({"seed": seed, "zero": zero, "all": full})
        curves = {}
        for method in ["random", *args.methods]:
            name = curve_folder(method, args.explain)
            points = [finished_score(root / f"seed-{seed}" / name / f"ratio-{r}", metric) for r in args.ratios]
            missing += [f"seed-{seed}/{name}/ratio-{r}" for r, p in zip(args.ratios, points) if p is None]
            if zero is not None and full is not None and None not in points:
                curves[method] = [zero, *points, full]
            else:  # a curve under way (or its anchors): its finished points, each with its training time
                unfinished += [{"method": method, "seed": seed, "ratio": r, "score": p, "train_seconds": train_seconds(point_folder(seed, method, r))}
                               for r, p in zip(args.ratios, points) if p is not None]
        missing += [f"seed-{seed}/{what}" for what, v in (("unmasked", zero), ("all/ratio-100", full)) if v is None]
        ratios = [0, *args.ratios, 100]
        if "random" in curves and len(curves) > 1:  # a RACU rests on this seed's retrains
            used += [zero_folder(seed), root / f"seed-{seed}" / "all" / "ratio-100"]
            used += [point_folder(seed, m, r) for m in curves for r in args.ratios]
        for method, curve in curves.items():
            rows += [{"method": method, "seed": seed, "ratio": r, "score": v, "train_seconds": train_seconds(point_folder(seed, method, r))}
                     for r, v in zip(ratios, curve)]
            if method != "random" and "random" in curves:
                per_seed.append({"method": method, "seed": seed, "racu": 100 * racu(ratios, curve, curves["random"])})
    summary = []
    others = other_curves(root, args, zero_of=lambda seed: finished_score(zero_folder(seed), metric), metric=metric)
    for method in args.methods:
        values = [r["racu"] / 100 for r in per_seed if r["method"] == method]
        ci = mean_interval(values, seed=0)
        paper = PUBLISHED[task].get(method)
        summary.append({"method": method, "ours": MEASURES[method][0], "options": MEASURES[method][1], "explain": args.explain,
                        "seeds": ci["n"], "racu": 100 * ci["mean"], "low": 100 * ci["low"], "high": 100 * ci["high"],
                        "published": paper and {"racu": paper[0], "low": paper[1], "high": paper[2]}})
    return {"task": task, "vectors": args.vectors, "metric": metric, "partial": True, "seeds_asked": args.seeds, "racu": summary,
            "racu_per_seed": per_seed, "curves": rows, "anchors": anchors, "unfinished_points": unfinished, "missing_retrains": missing,
            "other_curves": others, "training": training_time(used)}


def other_curves(root: Path, args: argparse.Namespace, zero_of: Callable[[int], float | None], metric: str) -> list[dict[str, Any]]:
    """The RACU of every complete curve in ``root`` that is none of ``args.methods``' (an earlier definition of a
    measure, kept as finished work), per folder: each seed's beside that seed's random curve, the mean and interval."""
    measured = {"all", "unmasked", "random", *(measure_folder(m, args.explain) for m in args.methods)}
    ratios, found = [0, *args.ratios, 100], {}
    for seed in range(args.seeds):
        folder = root / f"seed-{seed}"
        zero, full = zero_of(seed), finished_score(folder / "all" / "ratio-100", metric)
        random = [finished_score(folder / "random" / f"ratio-{r}", metric) for r in args.ratios]
        names = sorted(p.name for p in folder.glob("*") if p.is_dir() and p.name not in measured)
        for name in names:
            points = [finished_score(folder / name / f"ratio-{r}", metric) for r in args.ratios]
            if zero is None or full is None or None in points or None in random:
                continue
            curve, baseline = [zero, *points, full], [zero, *random, full]
            found.setdefault(name, []).append({"seed": seed, "racu": 100 * racu(ratios, curve, baseline), "curve": curve})
    out = []
    for name, seeds in found.items():
        ci = mean_interval([s["racu"] / 100 for s in seeds], seed=0)
        out.append({"folder": name, "seeds": ci["n"], "racu": 100 * ci["mean"], "low": 100 * ci["low"], "high": 100 * ci["high"],
                    "per_seed": seeds})
    return out


def seeds(n: int) -> str:
    """``n seeds`` (``1 seed``)."""
    return f"{n} seed{'' if n == 1 else 's'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--tasks", default="sst,babi1", help="comma-separated: sst, babi1, babi2, babi3")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--ratios", default="10,20,30,40,50,60,70,80,90")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=None, help="override the preset's epochs (smoke runs)")
    parser.add_argument("--limit", type=int, default=None, help="train, dev and test cut to N examples each (smoke runs)")
    parser.add_argument("--runs", type=Path, default=RUNS)
    parser.add_argument("--vectors", default=None, help="start the embeddings (base and every retrain) from pretrained "
                        "vectors: a word2vec/GloVe file, minilm or hf:MODEL (train --vectors); runs in roar-<task>-vectors-<name>")
    parser.add_argument("--engine", default="local", help="local, or ray: every (seed, method) curve a Ray task (--workers at once)")
    parser.add_argument("--workers", type=int, default=None, help="Ray workers for --engine ray (default: one per CPU)")
    parser.add_argument("--together", action="store_true", help="each round's retrains (every seed's and measure's next "
                        "ratio) trained as one stacked model: the same sub-runs, faster on a GPU (roar --together)")
    parser.add_argument("--explain", default="gold", choices=("gold", "predicted"), help="the class the measures explain: "
                        "gold, as their code does, or predicted (the class predicted by the model each step's masks come from: whether the gold "
                        "label travels in the masks); predicted curves have folders of their own beside the gold ones")
    parser.add_argument("--name", default="roar", help="result file benchmarks/results/NAME.json")
    parser.add_argument("--so-far", action="store_true", help="train nothing: the RACU of the curves finished so far (NAME_so_far.json)")
    args = parser.parse_args()
    args.methods = [m for m in args.methods.split(",") if m]
    args.ratios = [int(r) for r in args.ratios.split(",") if r]
    tasks = [t for t in args.tasks.split(",") if t]
    unknown = [t for t in tasks if t not in PROTOCOL]
    if unknown:
        parser.error(f"unknown task(s) {', '.join(unknown)}; choose {', '.join(PROTOCOL)}")
    if args.so_far:
        parts = [so_far(task, args) for task in tasks]
        for part in parts:
            print(f"{part['task']}: " + ", ".join(f"{r['method']} {r['racu']:.1f} ({seeds(r['seeds'])})" for r in part["racu"])
                  + f"; {part['training']['retrains']} retrains, {part['training']['train_hours']:.1f} hours of training"
                  + f"; {len(part['missing_retrains'])} retrains missing; other curves: "
                  + (", ".join(f"{r['folder']} {r['racu']:.1f} ({seeds(r['seeds'])})" for r in part["other_curves"]) or "none"), flush=True)
        write_result(f"{args.name}_so_far", {"tasks": parts, "partial": True})
        write_ledger(tasks, args)
        return
    done: list[dict[str, Any]] = []
    start = time.perf_counter()
    for task in tasks:
        done.append(one_task(task, args))
        payload = {"tasks": done, "wall_seconds": round(time.perf_counter() - start, 1), "complete": len(done) == len(tasks),
                   "smoke": bool(args.limit or args.epochs)}
        print(f"{task}: " + ", ".join(f"{r['method']} {r['racu']:.1f}" for r in done[-1]["racu"]), flush=True)
        write_result(args.name, payload)
        write_ledger([task], args)


if __name__ == "__main__":
    main()
