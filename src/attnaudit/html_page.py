"""One self-contained HTML page: escaping, tables, safe inline JSON and the no-network Content-Security-Policy.

The audit report (:mod:`attnaudit.report`) and a generated sequence's view
(:mod:`attnaudit.explain.generation_view`) are both such pages; what they share lives here, below both.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
from importlib import resources
from typing import Any

MAX_TABLE_ROWS = 50

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


def numeric(value: Any) -> bool:
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
            f'<td class="num">{fmt(row.get(c))}</td>' if numeric(row.get(c)) else f"<td>{fmt(row.get(c, ''))}</td>"
            for c in columns
        )
        body.append(f"<tr>{cells}</tr>")
    more = f'<p class="muted">first {limit} of {len(rows)} rows (all of them are in the CSV/JSON)</p>' if len(rows) > limit else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{more}"


SIZE = "\x00report-size\x00"
"""Stands in for the page's own size until the page is complete (:func:`page`)."""


SCRIPTS = {"explorer-data": ("attnaudit.report", "explorer"), "generation-data": ("attnaudit.explain", "generation")}
"""Each JSON data block a page may hold and the package and name of the assets that draw it (``NAME.js``, ``NAME.css``)."""


def asset(name: str, package: str = "attnaudit.report") -> str:
    """A file shipped with a package (the report's ``explorer.js``, ``explorer.css``)."""
    return resources.files(package).joinpath(name).read_text(encoding="utf-8")


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
    drawn = [where for block, where in SCRIPTS.items() if f'id="{block}"' in body]
    scripts = [asset(f"{name}.js", package) for package, name in drawn]
    css = CSS + asset("explorer.css") + "".join(asset(f"{name}.css", package) for package, name in drawn if name != "explorer")
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


def script_json(data: Any) -> str:
    """``data`` as JSON that is safe inside ``<script type="application/json">``: ``<``, ``>``, ``&``
    (and so any ``</script>`` or ``<!--``) are written as unicode escapes, which JSON.parse reads back."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def round_sig(value: float, digits: int = 4) -> float | None:
    """``value`` to ``digits`` significant digits (None for NaN/inf: JSON has no NaN)."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.{digits}g}")
