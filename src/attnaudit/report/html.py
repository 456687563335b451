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
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnaudit.experiments.experiment import Result
from attnaudit.html_page import SIZE, esc, fmt, numeric, page, table
from attnaudit.report.paradigms import PARADIGM_TESTS, paradigms_section

HEAT_RGB = (230, 97, 1)
"""Heatmap colour at full importance (the orange end of ColorBrewer's PuOr); lighter = less."""
NEGATIVE_RGB = (11, 87, 208)
"""Colour of a negative score at full magnitude where signs are kept (the generated-sequence views)."""
MAX_INSTANCE_ROWS = 20

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


ABBREVIATIONS = {
    "tau": "τ", "rho": "ρ", "jsd": "JSD", "tvd": "TVD", "kl": "KL", "aer": "AER", "aopc": "AOPC", "auprc": "AUPRC",
    "comp": "comprehensiveness", "suff": "sufficiency", "ig": "IG", "loo": "LOO", "map": "MAP", "n": "count",
    "vs": "vs", "fx": "f(x)", "auc": "AUC", "roc": "ROC",
}
"""How a word of a statistic's id reads in the report."""
AGGREGATES = ("mean", "median")


def statistic_words(name: str) -> str:
    """A verdict statistic's id as a reader wants it: ``tau_attention_vs_gradient_mean`` → ``mean τ(attention, gradient)``,
    ``max_jsd_mean`` → ``mean max JSD``; a name already in words (with a space) is kept. The id stays the CSV's column
    and the cell's tooltip."""
    if " " in name or not name:
        return name
    words = name.split("_")
    aggregate = words.pop() if len(words) > 1 and words[-1] in AGGREGATES else ""
    if "vs" in words[1:-1] and words[0] in ("tau", "rho"):
        cut = words.index("vs", 1)
        text = f"{ABBREVIATIONS[words[0]]}({' '.join(words[1:cut])}, {' '.join(words[cut + 1:])})"
    else:
        text = " ".join(ABBREVIATIONS.get(word, word) for word in words)
    return f"{aggregate} {text}" if aggregate else text


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
            cell = f'<td class="num">{fmt(value)}</td>' if numeric(value) else f"<td>{fmt(value)}</td>"
            rows.append(
                f"<tr><td>{link}</td><td title=\"{esc(r.get('statistic', ''))}\">{esc(statistic_words(str(r.get('statistic', ''))))}</td>{cell}"
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


def token(text: str, weight: float, score: float, rationale: bool, template: bool = False) -> str:
    """One token span, background opacity proportional to ``weight`` in [0, 1]; ``template``: a chat template's own
    token, greyed (its score in the title)."""
    r, g, b = HEAT_RGB
    alpha = min(max(weight, 0.0), 1.0)
    cls = "tok rat" if rationale else "tok"
    style = "color:#999;background:#eee" if template else f"background:rgba({r},{g},{b},{alpha:.3f})"
    return f'<span class="{cls}" style="{style}" title="{esc(f"{score:.4g}")}">{esc(text)}</span>'



def _plain(value: Any) -> str:
    """A value as unescaped text for a title (escaped once where it is put): 4 significant digits, n/a when missing."""
    return f"{value:.4g}" if numeric(value) and math.isfinite(value) else "n/a"


def shade(text: str, value: Any, peak: float, title: str) -> str:
    """A token span shaded by a signed ``value`` (orange positive, blue negative, opacity ``|value| / peak``;
    none for a missing value); ``title``: its hover text."""
    if not numeric(value) or not math.isfinite(value):
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
    values = {m: [abs(r[m]) for r in rows if numeric(r.get(m)) and math.isfinite(r[m])] for m in measures}
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
    roles = [str(r) for r in instance.get("roles") or []]  # a chat-rendered prompt: template tokens greyed
    head = [f"#{esc(instance.get('index'))}", f"gold: {esc(instance.get('label'))}"]
    if instance.get("predicted") is not None:
        head.append(f"predicted: {esc(instance['predicted'])}")
    if instance.get("tau") is not None:
        head.append(f"τ(attention, gradient) = {fmt(instance['tau'])}")
    rows = []
    for method, scores in instance.get("scores", {}).items():
        values = [abs(float(v)) for v in scores[: len(items)]]
        peak = max(values, default=0.0) or 1.0
        spans = "".join(token(t, v / peak, v, i in rationale, i < len(roles) and roles[i] == "template")
                        for i, (t, v) in enumerate(zip(items, values)))
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
    paradigms_link = '<a href="#paradigms">paradigms</a>' if any(s.name in PARADIGM_TESTS and s.result for s in sections) else ""
    general = ""
    if notes:
        general = '<h3>Notes</h3><ul class="notes">' + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>"
    body = [
        f"<header><h1>{esc(title)}</h1><p class=\"meta\">{fact_line}</p>",
        f'<nav><a href="#verdict">verdict</a>{paradigms_link}{explorer_link}<a href="#heatmaps">heatmaps</a>{nav}</nav></header>',
        '<section id="verdict"><h2>Verdict</h2>',
        "<p>Each test's headline numbers, the published figure where the paper reports one, and what they "
        "say about whether attention explains the predictions.</p>",
        verdict_table(sections),
        general,
        "</section>",
        paradigms_section({s.name: s.result for s in sections if s.result is not None}),
        explorer,
        heatmaps_section(heatmaps, heatmap_note),
        *(test_section(s, results_dir) for s in sections),
    ]
    return page(title, "".join(body))
