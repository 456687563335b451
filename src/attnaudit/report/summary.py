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
from attnaudit.experiments.experiment import AuditSettings, Experiment, Result, discover
from attnaudit.io import atomic_write, csv_cell

SUMMARY = "summary.csv"
AUDIT = "audit.json"
SUMMARY_COLUMNS = ["test", "statistic", "value", "published", "interpretation"]


def order_tests(names: typing.Iterable[str]) -> list[str]:
    """Cheap-first order: by each test's :attr:`~attnaudit.experiments.experiment.AuditSettings.rank`
    (unregistered names rank like tests without one), then by name."""
    registry = discover()
    return sorted(names, key=lambda n: (registry[n].settings.rank if n in registry else AuditSettings().rank, n))


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
