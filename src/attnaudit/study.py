"""A sweep's study page, ``OUT/study.html``: the audited models side by side.

One self-contained page (:mod:`attnaudit.html_page`: no network, no script) with what each job audited
(model, architecture, data, the instances tested), every headline statistic of the audits' verdict
tables (``summary.csv``) per model with a 95 % interval, and the explanation methods' faithfulness
ranking per model (the ``faithfulness`` test's ERASER scoreboard). It is written from the job records and
each job's stored results, so it can be rebuilt from a finished sweep folder (:func:`write_study`).

Intervals: the one a test reports (``<statistic>_ci`` in its summary); else, when the statistic is the mean
of a per-instance column (``tau_attention_vs_gradient_mean`` of ``tau_attention_vs_gradient``), a seeded
percentile bootstrap of that mean over the instances; else, for a share of instances (a statistic named
``fraction``, ``accuracy``, ``beats``, ``significant`` or ``rate``, and not ``mean``, ``median``, ...), the
Wilson interval over the tested instances; else none (shown as the value alone).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from attnaudit.errors import AttnAuditError
from attnaudit.html_page import esc, page, table
from attnaudit.io import atomic_write_text, read_json

STUDY_HTML = "study.html"
RANKED = "faithfulness"
PROPORTION_WORDS = {"fraction", "accuracy", "beats", "significant", "rate"}
SUMMARY_WORDS = {"mean", "median", "std", "min", "max"}
"""A statistic named with one of these summarises instances' values (a median fraction): no Wilson interval."""
Z95 = 1.959963984540054


def _results(folder: Path, test: str, cache: dict[tuple[Path, str], dict[str, Any] | None]) -> dict[str, Any] | None:
    """A job's stored result of ``test`` (``results/<test>.json``), None when missing or unreadable."""
    from attnaudit.audit import RESULTS

    key = (folder, test)
    if key not in cache:
        try:
            data = read_json(folder / RESULTS / f"{test}.json")
            cache[key] = data if isinstance(data, dict) else None
        except AttnAuditError:
            cache[key] = None
    return cache[key]


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def wilson(share: float, n: int) -> tuple[float, float]:
    """The 95 % Wilson score interval of a proportion ``share`` of ``n`` instances."""
    centre = (share + Z95**2 / (2 * n)) / (1 + Z95**2 / n)
    half = Z95 * math.sqrt(share * (1 - share) / n + Z95**2 / (4 * n * n)) / (1 + Z95**2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def interval(statistic: str, value: float, result: dict[str, Any] | None) -> tuple[float, float, str] | None:
    """The 95 % interval of one headline statistic and how it was found (see the module's docstring)."""
    from attnaudit.experiments.eraser_metrics import bootstrap_ci

    if result is None:
        return None
    reported = result.get("summary", {}).get(f"{statistic}_ci")
    if isinstance(reported, list) and len(reported) == 2 and all(_number(v) is not None for v in reported):
        return float(reported[0]), float(reported[1]), "reported by the test"
    column = statistic.removesuffix("_mean")
    values = [v for v in (_number(row.get(column)) for row in result.get("instances", []) if isinstance(row, dict)) if v is not None]
    if len(values) >= 2 and math.isclose(sum(values) / len(values), value, rel_tol=1e-9, abs_tol=1e-12):
        low, high = bootstrap_ci(values, seed=0)
        if math.isfinite(low):
            return low, high, "bootstrap over instances"
    n = result.get("meta", {}).get("n")
    words = set(statistic.split("_"))
    if PROPORTION_WORDS & words and not SUMMARY_WORDS & words and isinstance(n, int) and n > 0 and 0 <= value <= 1:
        return (*wilson(value, n), "Wilson interval")
    return None


def _label(record: dict[str, Any]) -> str:
    """A job's column heading: the model, its architecture and the job id."""
    params = record["params"]
    model = str(params.get("hf") or params.get("model", "?"))
    if Path(model).is_absolute() or model.startswith((".", "~")):  # a folder: its name (the job id says where)
        model = Path(model).name
    arch = record.get("architecture")
    return f"{model} ({arch})" if arch and arch != model else str(model)


def _cell(value: Any, bounds: tuple[float, float, str] | None) -> str:
    number = _number(value)
    if number is None:
        return esc(value)
    text = f"{number:.4g}"
    return text + (f" [{bounds[0]:.4g}, {bounds[1]:.4g}]" if bounds else "")


def _headline_cells(records: list[dict[str, Any]], folders: list[Path], cache: dict[tuple[Path, str], Any]
                    ) -> tuple[dict[str, dict[str, dict[int, str]]], set[str]]:
    """``{test: {statistic: {job index: cell}}}`` and how the intervals were found; a test a model did not run
    has a ``(not run)`` statistic saying skipped or failed (the reason on hover)."""
    cells: dict[str, dict[str, dict[int, str]]] = {}
    how: set[str] = set()
    for i, (record, folder) in enumerate(zip(records, folders)):
        for row in record.get("rows", []):
            test, statistic, value = row["test"], row["statistic"], row.get("value")
            if statistic in ("skipped", "error"):
                state = "skipped" if statistic == "skipped" else "failed"
                key, text = "(not run)", f'<span class="status-{state}" title="{esc(row.get("interpretation", ""))}">{state}</span>'
            elif _number(value) is None:
                continue
            else:
                bounds = interval(statistic, float(value), _results(folder, test, cache))
                how.update([bounds[2]] if bounds else [])
                key, text = statistic, f'<span title="{esc(bounds[2]) if bounds else "no interval"}">{_cell(value, bounds)}</span>'
            cells.setdefault(test, {}).setdefault(key, {})[i] = text
    return cells, how


def _headline_table(records: list[dict[str, Any]], folders: list[Path], cache: dict[tuple[Path, str], Any]) -> tuple[str, set[str]]:
    """Statistic × model: each model's value with its interval, tests in the audit's order."""
    from attnaudit.report.summary import order_tests

    cells, how = _headline_cells(records, folders, cache)
    if not cells:
        return '<p class="muted">(no finished test)</p>', how
    head = "".join(f"<th>{esc(_label(r))}<br><span class=muted>{esc(r['id'])}</span></th>" for r in records)
    body = "".join(
        f"<tr><td>{esc(test)}</td><td>{esc(statistic)}</td>"
        + "".join(f'<td class="num">{by_job.get(i, "")}</td>' for i in range(len(records)))
        + "</tr>"
        for test in order_tests(cells)
        for statistic, by_job in sorted(cells[test].items(), key=lambda item: item[0] != "(not run)")
    )
    return f"<table><thead><tr><th>test</th><th>statistic</th>{head}</tr></thead><tbody>{body}</tbody></table>", how


def _ranked(board: list[dict[str, Any]], mode: str, metric: str, higher: bool) -> list[str]:
    """One model's methods, best first by ``metric``, each as ``method value [low, high]``."""
    rows = [r for r in board if r.get("mode") == mode and _number(r.get(metric)) is not None]
    rows.sort(key=lambda r: r[metric], reverse=higher)
    cells = []
    for r in rows:
        low, high = _number(r.get(f"{metric}_low")), _number(r.get(f"{metric}_high"))
        bounds = (low, high, "") if low is not None and high is not None else None
        name = f"<b>{esc(r['method'])}</b>" if r["method"] == "attention" else esc(r["method"])
        cells.append(f"{name} {_cell(r[metric], bounds)}")
    return cells


def _attention_place(board: list[dict[str, Any]], mode: str) -> str:
    """Where attention ranks by AOPC comprehensiveness and whether its interval lies above random's."""
    rows = sorted((r for r in board if r.get("mode") == mode and _number(r.get("aopc_comp")) is not None),
                  key=lambda r: r["aopc_comp"], reverse=True)
    place = next((i + 1 for i, r in enumerate(rows) if r["method"] == "attention"), None)
    if place is None:
        return "not scored"
    attention = rows[place - 1]
    chance = next((r for r in rows if r["method"] == "random"), None)
    text = f"rank {place} of {len(rows)}"
    if chance is not None and _number(attention.get("aopc_comp_low")) is not None and _number(chance.get("aopc_comp_high")) is not None:
        beats = attention["aopc_comp_low"] > chance["aopc_comp_high"]
        text += "; beats random (intervals apart)" if beats else "; does not clearly beat random"
    return text


def _ranking_tables(records: list[dict[str, Any]], folders: list[Path], cache: dict[tuple[Path, str], Any]) -> str:
    """Per mode and metric, each model's explanation methods ranked (ERASER AOPC comprehensiveness: higher is
    more faithful; sufficiency: lower is), each with its 95 % interval; models without the test are left out."""
    boards = {i: (_results(folder, RANKED, cache) or {}).get("tables", {}).get("scoreboard", []) for i, folder in enumerate(folders)}
    boards = {i: board for i, board in boards.items() if board}
    modes = list(dict.fromkeys(row["mode"] for board in boards.values() for row in board))
    if not modes:
        return f'<p class="muted">no model ran the {RANKED} test (add it to audit.only)</p>'
    parts = []
    head = "".join(f"<th>{esc(_label(records[i]))}</th>" for i in boards)
    for mode in modes:
        for metric, higher in (("aopc_comp", True), ("aopc_suff", False)):
            columns = [_ranked(board, mode, metric, higher) for board in boards.values()]
            depth = max(len(c) for c in columns)
            body = "".join(f"<tr><td>{rank + 1}</td>" + "".join(f"<td>{c[rank] if rank < len(c) else ''}</td>" for c in columns)
                           + "</tr>" for rank in range(depth))
            if higher:
                body += "<tr><th>attention</th>" + "".join(f"<th>{esc(_attention_place(b, mode))}</th>" for b in boards.values()) + "</tr>"
            parts.append(f"<h3>AOPC {'comprehensiveness' if higher else 'sufficiency'} ({esc(mode)}; "
                         f"{'higher' if higher else 'lower'} = more faithful)</h3>"
                         f"<table><thead><tr><th>rank</th>{head}</tr></thead><tbody>{body}</tbody></table>")
    return "".join(parts)


def _audited(records: list[dict[str, Any]], folders: list[Path], cache: dict[tuple[Path, str], Any]) -> str:
    """One row per job: the model, its settings, the data and instances tested, status and time."""
    from attnaudit.report.html import subset_line

    rows = []
    for record, folder in zip(records, folders):
        tested = next((r["test"] for r in record.get("rows", []) if r["statistic"] not in ("skipped", "error")), None)
        meta = (_results(folder, tested, cache) or {}).get("meta", {}) if tested else {}
        settings = {k: v for k, v in record["params"].items() if k not in ("task", "model", "hf", "seed")}
        rows.append({
            "job": record["id"], "model": _label(record), "task": record["params"].get("task"),
            "settings": ", ".join(f"{k}={v}" for k, v in settings.items()) or "-", "seed": record["params"].get("seed"),
            "audited": subset_line(meta.get("subset")) or "-", "status": record["status"],
            "error": record.get("error") or "", "seconds": record.get("seconds"),
        })
    return table(rows, limit=len(rows))


def study_page(records: list[dict[str, Any]], out: Path, title: str) -> str:
    """The study's HTML: what was audited, headline statistics per model, faithfulness ranking per model."""
    folders = [out / record["id"] for record in records]
    cache: dict[tuple[Path, str], Any] = {}
    headline, how = _headline_table(records, folders, cache)
    failed = sum(record["status"] != "done" for record in records)
    intervals = ", ".join(sorted(how)) or "none"
    body = (
        f"<h1>{esc(title)}</h1>"
        f'<p class="meta">{len(records)} audit(s), {failed} failed; each audit\'s own report (every test, its figures and '
        f"explorer) is <code>JOB/report.html</code> beside this page, its numbers in <code>JOB/summary.csv</code>.</p>"
        f"<h2>What was audited</h2>{_audited(records, folders, cache)}"
        f"<h2>Headline statistics</h2><p class=meta>Each audit's verdict statistics (its summary.csv) with a 95% interval "
        f"(here: {esc(intervals)}; hover a value to see which; none where neither the test nor its instances give one; "
        f"hover <em>skipped</em> or <em>failed</em> for the reason).</p>"
        f"{headline}"
        f"<h2>Faithfulness ranking per model</h2><p class=meta>The {RANKED} test's explanation methods ranked by ERASER "
        f"AOPC comprehensiveness and sufficiency, mean [95% bootstrap interval] over the tested instances; "
        f"attention in bold.</p>"
        f"{_ranking_tables(records, folders, cache)}"
    )
    return page(title, body)


def write_study(out: Path, records: list[dict[str, Any]], title: str) -> Path:
    """``OUT/study.html`` (atomic)."""
    return atomic_write_text(out / STUDY_HTML, study_page(records, out, title))
