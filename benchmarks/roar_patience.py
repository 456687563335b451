"""Would early stopping have kept the same epoch? Measured on finished fixed-epoch runs (ROAR's retrains).

Madsen et al. (2022)'s bAbI protocol trains every retrain for 100 epochs and keeps the best dev epoch: about 20
minutes a retrain on one core here, 46 retrains a seed. Early stopping with patience ``P`` would keep the same model
whenever no later epoch beats the kept one after ``P`` epochs without improvement. This can be read off a finished
run exactly: the learning rate is constant over the epochs (AMSGrad, ``linear`` schedule without warm-up), so a run
stopped early trains the very same epochs first; its history is a prefix of the full run's, and it keeps the best
epoch of that prefix. Where that is the full run's kept epoch, the model, its test score and (in Recursive ROAR) every
later ratio's masks are the same. The epochs are replayed through the loop's own :class:`Selection` (strictly
better, from ``min_epoch`` on, a ceiling at 1.0).

For each run folder (a base run, or ROAR's ``subruns``) and each ``P``: how many fixed-epoch runs would keep the same
epoch, the epochs they would train out of those trained, and for the others the kept dev score they would lose.
Run: ``python benchmarks/roar_patience.py --runs ../runs-babi --patience 5,10,20 --name roar_babi_patience``;
writes ``benchmarks/results/NAME.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnaudit.io import read_json  # noqa: E402
from attnaudit.training.loop import Selection, metric_value  # noqa: E402
from benchmarks.common import write_result  # noqa: E402


def replay(values: list[float], selection: Selection) -> tuple[int, int]:
    """``(epochs run, kept epoch)`` of a run whose epochs score ``values`` on the selection metric, under ``selection``
    (as :func:`attnaudit.training.loop.fit` decides: an epoch is kept when strictly better, from ``min_epoch`` on;
    ``patience`` epochs in a row without improvement, or the kept score at the ceiling, end it)."""
    best, kept, bad = selection.start(), 0, 0
    for epoch, value in enumerate(values, start=1):
        if epoch >= selection.min_epoch:
            if selection.better(value, best):
                best, kept, bad = value, epoch, 0
            else:
                bad += 1
        if (selection.patience is not None and bad >= selection.patience) or selection.reached(best):
            return epoch, kept
    return len(values), kept


def one_run(path: Path, root: Path, patience: list[int]) -> dict[str, Any] | None:
    """A finished fixed-epoch run's kept epoch against each patience's; None for runs that stopped early themselves."""
    metrics = read_json(path)
    training = metrics.get("training", {})
    rule = training.get("selection", {})
    if not metrics.get("history") or rule.get("patience") is not None or not rule.get("metric"):
        return None
    metric = rule["metric"]
    values = [metric_value(record, metric) for record in metrics["history"]]
    base = Selection(metric, rule.get("mode", "max"), rule.get("min_epoch", 1), None, ceiling=rule.get("ceiling"))
    trained, kept = replay(values, base)
    if kept != training.get("selected_epoch", kept):
        raise SystemExit(f"{path}: replaying its history keeps epoch {kept}, the run kept {training['selected_epoch']}")
    row: dict[str, Any] = {"run": str(path.parent.relative_to(root)), "epochs": trained, "kept": kept,
                           "kept_dev": values[kept - 1], "test": metrics.get("test", {})}
    for p in patience:
        stop, keep = replay(values, Selection(metric, base.mode, base.min_epoch, p, ceiling=base.ceiling))
        row[f"patience_{p}"] = {"epochs": stop, "kept": keep, "same": keep == kept, "dev_lost": values[kept - 1] - values[keep - 1]}
    return row


def summary(rows: list[dict[str, Any]], patience: list[int]) -> dict[str, Any]:
    """Per patience: runs keeping the same epoch, epochs trained against the full runs', the largest dev score lost."""
    out: dict[str, Any] = {}
    for p in patience:
        mine = [r[f"patience_{p}"] for r in rows]
        out[str(p)] = {"runs": len(rows), "same": sum(m["same"] for m in mine),
                       "epochs": sum(m["epochs"] for m in mine), "epochs_full": sum(r["epochs"] for r in rows),
                       "max_dev_lost": max((m["dev_lost"] for m in mine), default=0.0)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, required=True, help="folder searched for finished runs (metrics.json)")
    parser.add_argument("--patience", default="5,10,20")
    parser.add_argument("--name", default="roar_patience")
    args = parser.parse_args()
    patience = [int(p) for p in args.patience.split(",") if p]
    found = sorted(args.runs.rglob("metrics.json"))
    rows = [row for path in found if ".partial" not in path.parts and (row := one_run(path, args.runs, patience))]
    result = {"runs": rows, "summary": summary(rows, patience), "patience": patience}
    for p, s in result["summary"].items():
        print(f"patience {p}: {s['same']}/{s['runs']} runs keep the same epoch; {s['epochs']} of {s['epochs_full']} epochs; "
              f"largest dev score lost {s['max_dev_lost']:.4f}")
    write_result(args.name, result)


if __name__ == "__main__":
    main()
