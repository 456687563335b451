"""Reproduce the sparse-attention study's Table 1 (slow; not part of `make test`).

Usage:
    .venv/bin/python benchmarks/reproduce_sparse.py --data-dir ../shared/data [--quick] [--seeds 3]

Trains Transformer classifiers on SST-2 with softmax, entmax15 and sparsemax attention, one
per seed, and runs on each the change of activation (``activation-swap``), ``shuffle``,
``key-adversary``, ``random-keys`` and ``opposite-keys`` tests. Runs go to
``benchmarks/runs/sparse[-quick]/<normaliser>-seed<k>-train<N|all>`` and are resumable
(a finished model is loaded; a test whose saved result has the same options is reused).
Table 1 (accuracy in %, mean ± std over seeds; one column block per normaliser) and the
study's headline (shuffling costs entmax15 26.75 points, softmax 7) go to
``benchmarks/results/sparse.json``; a combined attention heatmap (one sentence, every
normaliser × test) to ``benchmarks/results/sparse_attention.png``.

The models use the settings of ``reproduce_base_models.py`` for SST-2 (2 layers, 4 heads,
d_model 128, MiniLM static input vectors, 2 epochs, lr 5e-4, vocabulary 20k). Tests run on the ``test`` split by default:
attnaudit's ``sst2`` test split is GLUE SST-2's labelled dev sentences, never used for model
selection (selection uses phrases split off train.tsv).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

if __package__ in (None, ""):
    # Run as a plain script (`python benchmarks/reproduce_sparse.py`): make `benchmarks` importable.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnaudit.data.tasks import load_task  # noqa: E402
from attnaudit.data.types import TaskData  # noqa: E402
from attnaudit.experiments.common.rows import ATTENTION_TABLE  # noqa: E402
from attnaudit.experiments.experiment import Result  # noqa: E402
from attnaudit.experiments.runner import run_test  # noqa: E402
from attnaudit.io import atomic_write_json  # noqa: E402
from attnaudit.run import Run  # noqa: E402
from attnaudit.training.trainer import train  # noqa: E402
from benchmarks.common import RESULTS, RUNS, provenance  # noqa: E402

NORMALISERS = ["softmax", "entmax15", "sparsemax"]
# The SST-2 settings of reproduce_base_models.py, so its two seed-0 models can be reused as-is.
MODEL = {"layers": 2, "heads": 4, "lr": 5e-4, "patience": 1, "max_vocab": 20000, "vectors": "minilm"}
FULL = {"epochs": 2, "train_limit": None, "test_limit": None, "repeats": 5, "key_epochs": 3, "key_train_limit": 5000}
QUICK = {"epochs": 2, "train_limit": 4000, "test_limit": 300, "repeats": 3, "key_epochs": 2, "key_train_limit": 1000}
KEY_TESTS = {"adversarial": "key-adversary", "random keys": "random-keys", "opposite": "opposite-keys"}
PUBLISHED = {
    "accuracy": {"softmax": 86.45, "entmax15": 85.05},
    "shuffle_drop_points": {"softmax": 7.0, "entmax15": 26.75},
    "source": "sparse-attention study, Table 1 (Transformer, SST-2), as quoted in the attnaudit briefs",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None, help="datasets folder (default $ATTNAUDIT_DATA)")
    parser.add_argument("--task", default="sst2", help="task name (synthetic for a smoke run)")
    parser.add_argument("--split", default="test", help="split the tests run on")
    parser.add_argument("--seeds", type=int, default=3, help="models per normaliser (seeds 0..N-1)")
    parser.add_argument("--normalisers", default=",".join(NORMALISERS))
    parser.add_argument("--quick", action="store_true", help="subset of train, fewer epochs/repeats: " + str(QUICK))
    for key, default in FULL.items():
        parser.add_argument("--" + key.replace("_", "-"), type=int, default=None, help=f"default {default} (quick: {QUICK[key]})")
    parser.add_argument("--model", default=None, help="override model options, e.g. d_model=16,heads=2,layers=2")
    parser.add_argument("--runs-dir", type=Path, default=None, help="default benchmarks/runs/sparse[-quick]")
    parser.add_argument("--out", type=Path, default=RESULTS / "sparse.json")
    parser.add_argument("--threads", type=int, default=1)
    return parser.parse_args(argv)


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """Effective run settings: full or quick defaults, overridden by explicit flags."""
    base = dict(QUICK if args.quick else FULL)
    base.update({k: getattr(args, k) for k in FULL if getattr(args, k) is not None})
    model = dict(MODEL)
    if args.model:
        for item in args.model.split(","):
            key, _, value = item.partition("=")
            model[key.strip()] = _number(value.strip())
    return {**base, "model": model, "seeds": args.seeds, "split": args.split, "task": args.task, "quick": args.quick}


def _number(text: str) -> int | float | str:
    """``"16"`` -> 16, ``"3e-3"`` -> 0.003, anything else unchanged (e.g. a normaliser name)."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def load_data(task: str, data_dir: str | None, train_limit: int | None) -> TaskData:
    """The task, with a seeded random subset of ``train_limit`` training examples if asked."""
    data = load_task(task, data_dir=data_dir)
    if train_limit is not None and train_limit < len(data.train):
        picked = sorted(random.Random(0).sample(range(len(data.train)), train_limit))
        data = replace(
            data,
            train=[data.train[i] for i in picked],
            notes=[*data.notes, f"train: random subset of {train_limit} examples (seed 0)"],
        )
    return data


def reuse_or_run(name: str, run: Run, split: str, limit: int | None, seed: int, **options: Any) -> Result:
    """The saved result of ``name`` on ``run`` when its options match, else a fresh run."""
    path = Path(run.path) / "results" / f"{name}.json"
    if path.exists():
        saved = Result.load(path)
        meta = saved.meta
        if meta.get("split") == split and meta.get("limit") == limit and meta.get("seed") == seed and all(
            meta.get("options", {}).get(k) == v for k, v in options.items()
        ):
            return saved
    return run_test(name, run, split=split, limit=limit, seed=seed, **options)


def run_all(run: Run, cfg: dict[str, Any], seed: int) -> dict[str, Result]:
    """Every test of Table 1 on one model."""
    common = {"split": cfg["split"], "limit": cfg["test_limit"], "seed": seed}
    key_options = {"epochs": cfg["key_epochs"], "train_limit": cfg["key_train_limit"]}
    results = {
        "activation-swap": reuse_or_run("activation-swap", run, **common),
        "shuffle": reuse_or_run("shuffle", run, **common, repeats=cfg["repeats"]),
    }
    for test in KEY_TESTS.values():
        results[test] = reuse_or_run(test, run, **common, **key_options)
    return results


def _cell(values: list[float]) -> dict[str, Any]:
    arr = np.asarray(values, dtype=float)
    return {"mean": float(arr.mean()), "std": float(arr.std()), "n": int(arr.size), "values": arr.tolist()}


def table1(per_run: dict[str, list[dict[str, Result]]], normalisers: list[str]) -> list[dict[str, Any]]:
    """Rows of Table 1: accuracy in % (mean ± std over seeds) per normaliser; JSD for key rows."""
    rows: list[dict[str, Any]] = []

    def row(name: str, pick: Any, jsd: Any = None) -> None:
        entry: dict[str, Any] = {"row": name}
        for norm in normalisers:
            entry[norm] = _cell([100.0 * pick(r) for r in per_run[norm]])
            if jsd is not None:
                entry[f"{norm}_jsd"] = _cell([jsd(r) for r in per_run[norm]])
        rows.append(entry)

    row("original", lambda r: r["activation-swap"].summary["accuracy_original"])
    for target in normalisers:
        entry: dict[str, Any] = {"row": f"change of activation -> {target}"}
        for norm in normalisers:
            if norm != target:
                entry[norm] = _cell([100.0 * r["activation-swap"].summary[f"accuracy_{target}"] for r in per_run[norm]])
        rows.append(entry)
    row("adversarial", lambda r: r["key-adversary"].summary["accuracy_attacked"], lambda r: r["key-adversary"].summary["jsd_mean"])
    row("shuffling", lambda r: r["shuffle"].summary["accuracy_shuffle_all_mean"])
    row("random keys", lambda r: r["random-keys"].summary["accuracy_attacked"], lambda r: r["random-keys"].summary["jsd_mean"])
    row("opposite", lambda r: r["opposite-keys"].summary["accuracy_attacked"], lambda r: r["opposite-keys"].summary["jsd_mean"])
    return rows


def headline(per_run: dict[str, list[dict[str, Result]]]) -> dict[str, Any]:
    """Shuffling cost (points) per normaliser and whether entmax15 loses more than softmax, as published."""
    drops = {
        norm: _cell([100.0 * r["shuffle"].summary["drop_all_mean"] for r in runs]) for norm, runs in per_run.items()
    }
    out: dict[str, Any] = {"shuffle_drop_points": drops, "published": PUBLISHED["shuffle_drop_points"]}
    if "softmax" in drops and "entmax15" in drops:
        out["entmax15_loses_more_than_softmax"] = drops["entmax15"]["mean"] > drops["softmax"]["mean"]
    if "softmax" in drops and "sparsemax" in drops:
        out["sparsemax_loses_more_than_softmax"] = drops["sparsemax"]["mean"] > drops["softmax"]["mean"]
    return out


def heatmap(first_seed: dict[str, dict[str, Result]], path: Path) -> list[Path]:
    """Sentence 0's last-layer attention for every normaliser (rows) and test (columns)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attnaudit.plotting import save_figure

    columns = [("original", "shuffle", "original"), ("shuffled", "shuffle", "shuffled (all layers)")]
    columns += [(label, test, None) for label, test in KEY_TESTS.items()]
    grid: dict[tuple[str, str], dict[str, Any]] = {}
    for norm, results in first_seed.items():
        for label, test, setting in columns:
            for item in results[test].tables.get(ATTENTION_TABLE, []):
                if item["index"] == 0 and (item["setting"] == setting if setting else item["setting"] != "original"):
                    grid[(norm, label)] = item
    if not grid:
        return []
    vmax = max(max(max(q) for q in item["weights"]) for item in grid.values()) or 1.0
    norms = list(first_seed)
    fig, axes = plt.subplots(len(norms), len(columns), figsize=(2.8 * len(columns), 2.8 * len(norms)),
                             squeeze=False, layout="constrained")
    image = None
    for r, norm in enumerate(norms):
        for c, (label, _, _) in enumerate(columns):
            ax = axes[r][c]
            item = grid.get((norm, label))
            ax.set_xticks([])
            ax.set_yticks([])
            if item is None:
                continue
            image = ax.imshow(item["weights"], vmin=0.0, vmax=vmax, cmap="viridis")
            if r == len(norms) - 1:
                tokens = item["tokens"]
                ticks = list(range(0, len(tokens), max(1, -(-len(tokens) // 20))))
                ax.set_xticks(ticks, [tokens[t] for t in ticks], rotation=90, fontsize=6)
            if c == 0:
                ax.set_ylabel(norm)
            if r == 0:
                ax.set_title(label, fontsize=9)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.6)
    fig.suptitle("the same sentence: last-layer attention (mean over heads) per normaliser and test", fontsize=10)
    return save_figure(fig, path.parent, path.stem)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = settings(args)
    normalisers = [n.strip() for n in args.normalisers.split(",") if n.strip()]
    runs_dir = args.runs_dir or RUNS / ("sparse-quick" if args.quick else "sparse")
    start = time.perf_counter()
    data = load_data(args.task, args.data_dir, cfg["train_limit"])
    per_run: dict[str, list[dict[str, Result]]] = {n: [] for n in normalisers}
    timing: dict[str, dict[str, Any]] = {}
    for norm in normalisers:
        for seed in range(args.seeds):
            name = f"{norm}-seed{seed}-train{cfg['train_limit'] or 'all'}"
            run = train(data, "transformer", runs_dir / name, data_dir=args.data_dir, attention=norm, seed=seed,
                        epochs=cfg["epochs"], quiet_eval=True, **cfg["model"])
            # The key tests train on run.data().train: keep the (possibly subsetted) data even
            # when train() loaded an existing run, whose reload would read the full task.
            run._data = data
            results = run_all(run, cfg, seed)
            per_run[norm].append(results)
            timing[name] = {
                "train_seconds": _train_seconds(run),
                **{test: res.meta.get("seconds") for test, res in results.items()},
            }
            print(f"{name}: accuracy {100 * results['activation-swap'].summary['accuracy_original']:.2f}, "
                  f"shuffled {100 * results['shuffle'].summary['accuracy_shuffle_all_mean']:.2f}", flush=True)
    figures = heatmap({n: runs[0] for n, runs in per_run.items()}, args.out.with_name(args.out.stem + "_attention.png"))
    payload = {
        "name": "sparse",
        "task": args.task,
        "settings": cfg,
        "data_notes": data.notes,
        "table1": table1(per_run, normalisers),
        "headline": headline(per_run),
        "published": PUBLISHED,
        "runs": {
            norm: [{test: res.summary for test, res in results.items()} for results in runs]
            for norm, runs in per_run.items()
        },
        "timing_seconds": timing,
        "figures": [str(p) for p in figures],
        "wall_seconds": time.perf_counter() - start,
        **provenance(),
    }
    atomic_write_json(args.out, payload)
    print(f"wrote {args.out} in {payload['wall_seconds']:.0f}s")
    return payload


def _train_seconds(run: Run) -> float | None:
    from attnaudit.io import read_json

    metrics = Path(run.path) / "metrics.json"
    return read_json(metrics).get("train_seconds") if metrics.exists() else None


if __name__ == "__main__":
    main()
