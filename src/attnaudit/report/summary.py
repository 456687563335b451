"""The order of an audit's tests and its ``summary.csv``: one row per verdict statistic, plus a
row per skipped or failed test.

:mod:`attnaudit.audit` runs the tests in this order and writes the summary after an audit;
:func:`attnaudit.report.build_report` rewrites it from the stored results, so both follow the
current verdict code.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import pandas as pd

from attnaudit.errors import error_line
from attnaudit.experiments.base import Experiment, Result, discover
from attnaudit.io import atomic_write, csv_cell

# Cheap tests first; the training-based ones (each trains models) last. Tests registered
# later and missing here run between the two groups, in name order.
CHEAP_ORDER = (
    "identifiability",
    "rationale",
    "importance",
    "norms",
    "rollout",
    "permutation",
    "activation-swap",
    "shuffle",
    "erasure",
    "adversarial",
    "random-keys",
    "opposite-keys",
    "key-adversary",
)
TRAINING_ORDER = ("uniform", "probe", "diagnostic", "seeds", "global-adversary")
SUMMARY = "summary.csv"
AUDIT = "audit.json"
SUMMARY_COLUMNS = ["test", "statistic", "value", "published", "interpretation"]


def order_tests(names: typing.Iterable[str]) -> list[str]:
    """Cheap-first order: :data:`CHEAP_ORDER`, then unknown tests by name, then :data:`TRAINING_ORDER`."""
    names = list(names)
    cheap = [n for n in CHEAP_ORDER if n in names]
    training = [n for n in TRAINING_ORDER if n in names]
    middle = sorted(n for n in names if n not in cheap and n not in training)
    return cheap + middle + training


def verdict_rows(name: str, result: Result) -> list[dict[str, Any]]:
    """The test's verdict rows (its own ``verdict``, else the default), each tagged with the test name."""
    registry = discover()
    experiment = registry[name]() if name in registry else Experiment()
    try:
        rows = experiment.verdict(result)
    except Exception as exc:  # a broken verdict must not hide the numbers: fall back to the summary
        rows = Experiment.verdict(experiment, result)
        rows.append({"statistic": "verdict", "value": "", "published": "", "interpretation": f"verdict failed: {error_line(exc)}"})
    return [{"test": name, **{k: row.get(k, "") for k in SUMMARY_COLUMNS[1:]}} for row in rows]


def summary_rows(log: list[dict[str, Any]], results: dict[str, Result]) -> list[dict[str, Any]]:
    """Verdict rows of every result plus one row per skipped or failed test, in the audit's order.

    ``log`` is ``audit.json``'s list of tests (empty for results written by ``attnaudit run``).
    """
    rows: list[dict[str, Any]] = []
    logged = [entry["test"] for entry in log]
    for entry in [*log, *({"test": name} for name in order_tests(results) if name not in logged)]:
        name, state = entry["test"], entry.get("status")
        if state == "skipped":
            rows.append({"test": name, "statistic": "skipped", "value": "", "published": "", "interpretation": entry.get("reason", "")})
        elif state == "failed":
            rows.append({"test": name, "statistic": "error", "value": "", "published": "", "interpretation": entry.get("error", "")})
        elif name in results:
            rows.extend(verdict_rows(name, results[name]))
    return rows


def write_summary(path: Path, rows: list[dict[str, Any]]) -> Path:
    """``summary.csv``: one row per statistic, skipped and failed tests included."""
    frame = pd.DataFrame([{k: csv_cell(r.get(k, "")) for k in SUMMARY_COLUMNS} for r in rows], columns=SUMMARY_COLUMNS)
    return atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))
