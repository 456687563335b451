"""The audit report as one self-contained HTML file: inline CSS, base64 PNG figures, one inline script.

Every piece of text that comes from data or results (tokens, labels, notes, error messages,
option values) goes through :func:`html.escape`, so a token such as
``<script>alert(1)</script>`` is shown as text and never parsed as markup. Everything but the
explorer (:mod:`attnaudit.report.explorer`) is static HTML, readable with JavaScript off;
collapsible parts use ``<details>``. A Content-Security-Policy forbids every network access and
allows only the explorer's own script (by its hash).
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from attnaudit.experiments.experiment import Result

HEAT_RGB = (230, 97, 1)
"""Heatmap colour at full importance (the orange end of ColorBrewer's PuOr); lighter = less."""
NEGATIVE_RGB = (11, 87, 208)
"""Colour of a negative score at full magnitude where signs are kept (the generated-sequence views)."""
MAX_TABLE_ROWS = 50
MAX_INSTANCE_ROWS = 20

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1b1b1b;margin:0;background:#fafafa}
main{max-width:1100px;margin:0 auto;padding:24px 28px 60px;background:#fff}
h1{font-size:24px;margin:0 0 4px}h2{font-size:19px;margin:32px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px}
.meta{color:#555;margin:0 0 12px}.muted{color:#666}
table{border-collapse:collapse;margin:6px 0 12px;font-size:13px}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f1f1f1}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
table.verdict td:nth-child(5){max-width:480px}
.status-failed{color:#b00020;font-weight:600}.status-skipped{color:#8a6d00}
nav{font-size:13px;margin:8px 0 0}nav a{margin-right:10px;color:#0b57d0;text-decoration:none}
img.figure{max-width:100%;border:1px solid #eee;margin:6px 0}
ul.notes{margin:4px 0 10px 18px;padding:0}
details{margin:6px 0}summary{cursor:pointer;color:#0b57d0}
pre{background:#f6f6f6;padding:8px;overflow-x:auto;font-size:12px}
.instance{border:1px solid #e3e3e3;border-radius:4px;padding:8px 10px;margin:10px 0}
.instance .head{font-size:13px;color:#333;margin-bottom:4px}
table.heat{border:none;margin:0}
table.heat th{background:none;border:none;font-weight:600;white-space:nowrap;padding:4px 8px 4px 0;font-size:12px;color:#444}
table.heat td{border:none;padding:2px 0;line-height:1.9}
.tok{display:inline-block;padding:0 3px;margin:1px 1px;border-radius:2px;
font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;color:#111;white-space:pre}
.tok.rat{box-shadow:inset 0 -2px 0 #0b57d0}
.tok.na{outline:1px dashed #bbb;outline-offset:-1px}
details.sequence{border:1px solid #e3e3e3;border-radius:4px;padding:4px 10px;overflow-x:auto}
.legend .tok{margin-right:6px}
"""


@dataclass
class Section:
    """One test's part of the report."""

    name: str
    description: str = ""
    paper: str = ""
    result: Result | None = None
    verdict: list[dict[str, Any]] = field(default_factory=list)
    status: str = "done"
    reason: str = ""
    traceback: str = ""
    measures: dict[str, str] = field(default_factory=dict)
    """Per-token columns of a test over generated sequences (:meth:`~attnaudit.experiments.experiment.Experiment.token_measures`)."""


def esc(value: Any) -> str:
    """Escaped text for any value (quotes too, so it is safe inside attributes)."""
    return html.escape(str(value), quote=True)


def fmt(value: Any) -> str:
    """A cell value as escaped text: floats to 4 significant digits, None/NaN as 'n/a'."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if isinstance(value, bool):
        return esc(value)
    if isinstance(value, float):
        return esc(f"{value:.4g}")
    if isinstance(value, (dict, list, tuple)):
        return esc(json.dumps(value, default=str))
    return esc(value)


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def table(rows: list[dict[str, Any]], limit: int = MAX_TABLE_ROWS) -> str:
    """An HTML table of row dicts (columns: the union of keys, in first-seen order)."""
    if not rows:
        return '<p class="muted">(empty)</p>'
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = []
    for row in rows[:limit]:
        cells = "".join(
            f'<td class="num">{fmt(row.get(c))}</td>' if _numeric(row.get(c)) else f"<td>{fmt(row.get(c, ''))}</td>"
            for c in columns
        )
        body.append(f"<tr>{cells}</tr>")
    more = f'<p class="muted">first {limit} of {len(rows)} rows (all of them are in the CSV/JSON)</p>' if len(rows) > limit else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{more}"


def figure(path: Path) -> str:
    """A PNG inlined as base64 (no file or network access when the report is opened)."""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img class="figure" alt="{esc(path.stem)}" src="data:image/png;base64,{data}">'


def _figure_paths(result: Result, results_dir: Path) -> list[Path]:
    """The PNG figures of a result: its recorded paths, else the file of that name in ``results_dir``."""
    found = []
    for name in result.figures:
        path = Path(name)
        if path.suffix.lower() != ".png":
            continue
        for candidate in (path, results_dir / path.name):
            if candidate.is_file():
                found.append(candidate)
                break
    return found


def _anchor(name: str) -> str:
    return "test-" + "".join(c if c.isalnum() or c in "-_" else "-" for c in name)


def verdict_table(sections: list[Section]) -> str:
    """Top table: per test its headline statistics, the published figure beside ours, and what they say."""
    rows = []
    for s in sorted(sections, key=lambda s: s.status == "failed"):  # results first, then failures
        link = f'<a href="#{_anchor(s.name)}">{esc(s.name)}</a>'
        if s.status == "failed":
            rows.append(f'<tr><td>{link}</td><td class="status-failed">failed</td><td></td><td></td><td>{esc(s.reason)}</td></tr>')
            continue
        if s.status == "skipped":
            continue
        shown = [r for r in s.verdict if r.get("interpretation")] or s.verdict[:1]
        for r in shown:
            value = r.get("value")
            cell = f'<td class="num">{fmt(value)}</td>' if _numeric(value) else f"<td>{fmt(value)}</td>"
            rows.append(
                f"<tr><td>{link}</td><td>{esc(r.get('statistic', ''))}</td>{cell}"
                f"<td>{fmt(r.get('published', ''))}</td><td>{esc(r.get('interpretation', ''))}</td></tr>"
            )
    head = "<tr><th>test</th><th>statistic</th><th>ours</th><th>published</th><th>what it says about faithfulness</th></tr>"
    skipped = [s for s in sections if s.status == "skipped"]
    listed = ""
    if skipped:
        links = ", ".join(f'<a href="#{_anchor(s.name)}" title="{esc(s.reason)}">{esc(s.name)}</a>' for s in skipped)
        listed = f'<p class="status-skipped">Not applicable to this model (each section says why): {links}</p>'
    return f'<table class="verdict"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>{listed}'


def _published_block(published: Any) -> str:
    if not published:
        return ""
    if isinstance(published, dict):
        items = "".join(f"<li><b>{esc(k)}</b>: {fmt(v)}</li>" for k, v in published.items())
        return f'<h3>Published</h3><ul class="notes">{items}</ul>'
    return f"<h3>Published</h3><p>{fmt(published)}</p>"


def test_section(section: Section, results_dir: Path) -> str:
    """One test: description, verdict, summary, figures, tables, notes, options."""
    parts = [f'<section id="{_anchor(section.name)}"><h2>{esc(section.name)}</h2>']
    if section.description:
        paper = f' <span class="muted">({esc(section.paper)})</span>' if section.paper else ""
        parts.append(f"<p>{esc(section.description)}{paper}</p>")
    result = section.result
    if section.status == "skipped":
        parts.append(f'<p class="status-skipped">Not applicable: {esc(section.reason)}</p></section>')
        return "".join(parts)
    if section.status == "failed" or result is None:
        parts.append(f'<p class="status-failed">Failed: {esc(section.reason)}</p>')
        if section.traceback:
            parts.append(f"<details><summary>traceback</summary><pre>{esc(section.traceback)}</pre></details>")
        parts.append("</section>")
        return "".join(parts)
    meta = result.meta
    facts = [f"{k}: {fmt(meta[k])}" for k in ("n", "split", "limit", "seed", "seconds") if meta.get(k) is not None]
    if meta.get("subset"):
        facts.append(f"audited: {subset_line(meta['subset'])}")
    if facts:
        parts.append(f'<p class="meta">{" · ".join(facts)}</p>')
    if section.verdict:
        parts.append("<h3>Verdict</h3>" + table(section.verdict))
    parts.append("<h3>Summary</h3>" + table([{"statistic": k, "value": v} for k, v in result.summary.items()]))
    for path in _figure_paths(result, results_dir):
        parts.append(figure(path))
    if section.measures:
        parts.append(sequences_block(result.instances, section.measures))
    for name, rows in result.tables.items():
        parts.append(f"<details><summary>table: {esc(name)} ({len(rows)} rows)</summary>{table(rows)}</details>")
    if result.instances:
        parts.append(
            f"<details><summary>instances ({len(result.instances)}; full list in {esc(result.test)}.csv)</summary>"
            f"{table(result.instances, limit=MAX_INSTANCE_ROWS)}</details>"
        )
    notes = meta.get("notes") or []
    if notes:
        parts.append('<h3>Notes</h3><ul class="notes">' + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>")
    parts.append(_published_block(meta.get("published")))
    if meta.get("options"):
        parts.append(f"<details><summary>options</summary>{table([meta['options']])}</details>")
    parts.append("</section>")
    return "".join(parts)


def token(text: str, weight: float, score: float, rationale: bool) -> str:
    """One token span, background opacity proportional to ``weight`` in [0, 1]."""
    r, g, b = HEAT_RGB
    alpha = min(max(weight, 0.0), 1.0)
    cls = "tok rat" if rationale else "tok"
    return (
        f'<span class="{cls}" style="background:rgba({r},{g},{b},{alpha:.3f})" '
        f'title="{esc(f"{score:.4g}")}">{esc(text)}</span>'
    )


def _plain(value: Any) -> str:
    """A value as unescaped text for a title (escaped once where it is put): 4 significant digits, n/a when missing."""
    return f"{value:.4g}" if _numeric(value) and math.isfinite(value) else "n/a"


def shade(text: str, value: Any, peak: float, title: str) -> str:
    """A token span shaded by a signed ``value`` (orange positive, blue negative, opacity ``|value| / peak``;
    none for a missing value); ``title``: its hover text."""
    if not _numeric(value) or not math.isfinite(value):
        return f'<span class="tok na" title="{esc(title)}">{esc(text)}</span>'
    r, g, b = HEAT_RGB if value >= 0 else NEGATIVE_RGB
    alpha = min(abs(value) / peak, 1.0) if peak > 0 else 0.0
    return f'<span class="tok" style="background:rgba({r},{g},{b},{alpha:.3f})" title="{esc(title)}">{esc(text)}</span>'


def sequences_block(rows: list[dict[str, Any]], measures: dict[str, str]) -> str:
    """Each generated sequence (the rows of one ``index``, in ``step`` order) as its tokens shaded by every
    measure, one row each, scaled to the measure's largest magnitude over all tokens; then its values as a table."""
    sequences: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        sequences[row.get("index")].append(row)
    values = {m: [abs(r[m]) for r in rows if _numeric(r.get(m)) and math.isfinite(r[m])] for m in measures}
    peaks = {m: max(found, default=0.0) for m, found in values.items()}
    legend = "".join(f"<li><b>{esc(m)}</b>: {esc(about)} (largest magnitude {fmt(peaks[m])})</li>" for m, about in measures.items())
    parts = [
        "<h3>Generated tokens</h3><p>Each sequence's tokens shaded by each measure (orange: positive, blue: negative; "
        "each measure scaled to its largest magnitude over every token; hover for the value):</p>",
        f'<ul class="notes">{legend}</ul>',
    ]
    for number, (index, steps) in enumerate(sequences.items()):
        steps = sorted(steps, key=lambda r: r.get("step", 0))
        tokens = [str(r.get("token", "")).replace("\n", "\u21b5").replace("\t", "\u21e5") for r in steps]  # newlines, tabs shown
        heat = "".join(
            f'<tr data-measure="{esc(m)}"><th title="{esc(about)}">{esc(m)}</th><td>'
            + "".join(shade(t, r.get(m), peaks[m], f"step {r.get('step')} {t!r}: {m} = {_plain(r.get(m))}") for t, r in zip(tokens, steps))
            + "</td></tr>"
            for m, about in measures.items()
        )
        shown = [{"step": r.get("step"), "token": r.get("token"), **{m: r.get(m) for m in measures}} for r in steps]
        parts.append(
            f'<details class="sequence" data-index="{esc(index)}"{" open" if number == 0 else ""}>'
            f"<summary>#{esc(index)}: {esc(''.join(tokens))}</summary>"
            f'<table class="heat">{heat}</table>{table(shown)}</details>'
        )
    return "".join(parts)


def heatmap_block(instance: dict[str, Any]) -> str:
    """One instance: a row of token spans per explanation, each scaled to its own maximum magnitude."""
    items = [str(t) for t in instance.get("items", [])]
    rationale = set(instance.get("rationale") or [])
    head = [f"#{esc(instance.get('index'))}", f"gold: {esc(instance.get('label'))}"]
    if instance.get("predicted") is not None:
        head.append(f"predicted: {esc(instance['predicted'])}")
    if instance.get("tau") is not None:
        head.append(f"τ(attention, gradient) = {fmt(instance['tau'])}")
    rows = []
    for method, scores in instance.get("scores", {}).items():
        values = [abs(float(v)) for v in scores[: len(items)]]
        peak = max(values, default=0.0) or 1.0
        spans = "".join(token(t, v / peak, v, i in rationale) for i, (t, v) in enumerate(zip(items, values)))
        rows.append(f"<tr><th>{esc(method)}</th><td>{spans}</td></tr>")
    return (
        f'<div class="instance"><div class="head">{" · ".join(head)}</div>'
        f'<table class="heat">{"".join(rows)}</table></div>'
    )


def heatmaps_section(heatmaps: dict[str, Any] | None, note: str) -> str:
    """All instances' heatmaps, with a legend and how the instances were chosen."""
    parts = ['<section id="heatmaps"><h2>Explanations per instance</h2>']
    if not heatmaps or not heatmaps.get("instances"):
        parts.append(f'<p class="muted">{esc(note or "no heatmaps were computed")}</p></section>')
        return "".join(parts)
    parts.append(
        f"<p>{esc(heatmaps.get('selection', ''))}. Each row is one explanation over the explained items; the "
        "darker the background, the larger the importance (each row scaled to its own maximum; hover for the value). "
        "Underlined items belong to the known rationale."
        + (f" {esc(heatmaps['note'])}." if heatmaps.get("note") else "")
        + "</p>"
    )
    parts.append(
        '<p class="legend">'
        + token("low", 0.08, 0.0, False)
        + token("medium", 0.5, 0.5, False)
        + token("high", 1.0, 1.0, False)
        + token("rationale", 0.0, 0.0, True)
        + "</p>"
    )
    parts.extend(heatmap_block(instance) for instance in heatmaps["instances"])
    parts.append("</section>")
    return "".join(parts)


SIZE = "\x00report-size\x00"
"""Stands in for the page's own size until the page is complete (:func:`page`)."""


SCRIPTS = {"explorer-data": "explorer", "generation-data": "generation"}
"""Each JSON data block a page may hold and the assets that draw it (``NAME.js``, ``NAME.css``)."""


def asset(name: str) -> str:
    """A file shipped with the report package (``explorer.js``, ``explorer.css``)."""
    return resources.files("attnaudit.report").joinpath(name).read_text(encoding="utf-8")


def script_hash(script: str) -> str:
    """The CSP source that allows exactly this inline script."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii") + "'"


def content_security_policy(*scripts: str) -> str:
    """No network at all: no fetch/XHR, no external script, style, font, frame or image (figures are data: URIs);
    the page's own inline scripts allowed by their hashes (none: no script); inline styles allowed (the static heatmaps use them)."""
    allowed = " ".join(script_hash(s) for s in scripts) or "'none'"
    return (
        "default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
        f"script-src {allowed}; connect-src 'none'; base-uri 'none'; form-action 'none'"
    )


def megabytes(size: int) -> str:
    return f"{size / 1e6:.2f} MB"


def page(title: str, body: str, bare: bool = False) -> str:
    """The HTML document around ``body``: inline CSS, the script of each data block the body holds
    (:data:`SCRIPTS`: the explorer's, a generated sequence's), the no-network Content-Security-Policy,
    and the page's own size in place of :data:`SIZE`."""
    drawn = [name for block, name in SCRIPTS.items() if f'id="{block}"' in body]
    scripts = [asset(f"{name}.js") for name in drawn]
    css = CSS + asset("explorer.css") + "".join(asset(f"{name}.css") for name in drawn if name != "explorer")
    csp = content_security_policy(*scripts)
    document = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{esc(csp)}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{css}</style></head>"
        f'<body{" class=bare" if bare else ""}><main>{body}</main>'
        + "".join(f"<script>{script}</script>" for script in scripts)
        + "</body></html>\n"
    )
    size = len(document.encode("utf-8"))
    for _ in range(4):  # the number's own length changes the size; settles in a step or two
        text = megabytes(size)
        settled = len(document.replace(SIZE, text).encode("utf-8"))
        if megabytes(settled) == text:
            break
        size = settled
    return document.replace(SIZE, megabytes(size))


def subset_line(subset: dict[str, Any] | None) -> str | None:
    """``200 of 1821 (stratified by label, seed 0); labels 0: 100, 1: 100; split 0: 912, 1: 909`` (None: not recorded)."""
    if not subset:
        return None
    counts = ", ".join(f"{k}: {v}" for k, v in subset["labels"].items())
    whole = ", ".join(f"{k}: {v}" for k, v in subset["split_labels"].items())
    line = f"{subset['n']} of {subset['of']} ({subset['chosen']})"
    return f"{line}; labels {counts}; the split's {whole}" if counts else line


def render(
    title: str,
    facts: list[tuple[str, Any]],
    sections: list[Section],
    heatmaps: dict[str, Any] | None,
    heatmap_note: str,
    notes: list[str],
    results_dir: Path,
    explorer: str = "",
) -> str:
    """The whole page as a string (``explorer``: the explorer's section, :func:`explorer_section`)."""
    fact_line = " · ".join(f"{esc(k)}: {fmt(v)}" for k, v in facts if v not in (None, ""))
    fact_line += f" · report size: {SIZE}"
    nav = "".join(f'<a href="#{_anchor(s.name)}">{esc(s.name)}</a>' for s in sections)
    explorer_link = '<a href="#explorer">explorer</a>' if explorer else ""
    general = ""
    if notes:
        general = '<h3>Notes</h3><ul class="notes">' + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>"
    body = [
        f"<header><h1>{esc(title)}</h1><p class=\"meta\">{fact_line}</p>",
        f'<nav><a href="#verdict">verdict</a>{explorer_link}<a href="#heatmaps">heatmaps</a>{nav}</nav></header>',
        '<section id="verdict"><h2>Verdict</h2>',
        "<p>Each test's headline numbers, the published figure where the paper reports one, and what they "
        "say about whether attention explains the predictions.</p>",
        verdict_table(sections),
        general,
        "</section>",
        explorer,
        heatmaps_section(heatmaps, heatmap_note),
        *(test_section(s, results_dir) for s in sections),
    ]
    return page(title, "".join(body))
