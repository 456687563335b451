"""Which explanation is faithful, under each paradigm the field uses, side by side (one row per method).

* **erasure on the unchanged model**: ERASER's AOPC comprehensiveness (``faithfulness``; its ``delete`` mode where
  it ran), mean and 95 % interval;
* **remove and retrain**: RACU in % (``roar``), mean and 95 % interval over seeds;
* **sanity**: the model-parameter randomisation verdict (``sanity``) and Spearman ρ at full randomisation;
* and, beside them, whether erased inputs are in distribution for this model (``in-distribution``: the share
  judged out of distribution at the highest random-masking ratio), which says how far the erasure column can be
  read as faithfulness rather than distribution shift.

One sentence says where the paradigms disagree: the best method by erasure against the best by retraining, and
the methods one paradigm ranks above random that another finds unfaithful. Every number is read from the stored
results; nothing is recomputed.
"""

from __future__ import annotations

import math
from typing import Any

from attnaudit.experiments.experiment import Result
from attnaudit.html_page import esc, fmt

PARADIGM_TESTS = ("faithfulness", "roar", "sanity")
"""The tests whose results the section puts side by side (in-distribution qualifies the erasure column)."""
COLUMNS = ("method", "erasure", "erasure_low", "erasure_high", "racu", "racu_low", "racu_high", "sanity", "sanity_rho")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def paradigm_rows(results: dict[str, Result]) -> list[dict[str, Any]]:
    """One row per method any of ``faithfulness``, ``roar``, ``sanity`` scored (None where one did not)."""
    rows: dict[str, dict[str, Any]] = {}

    def row(method: str) -> dict[str, Any]:
        return rows.setdefault(method, dict.fromkeys(COLUMNS) | {"method": method})

    if "faithfulness" in results:
        board = results["faithfulness"].tables.get("scoreboard", [])
        modes = [r["mode"] for r in board]
        mode = "delete" if "delete" in modes else (modes[0] if modes else "")
        for r in board:
            if r["mode"] == mode:
                row(r["method"]).update(erasure=r.get("aopc_comp"), erasure_low=r.get("aopc_comp_low"), erasure_high=r.get("aopc_comp_high"))
    if "roar" in results:
        for r in results["roar"].tables.get("racu_summary", []):
            row(r["method"]).update(racu=r.get("racu"), racu_low=r.get("low"), racu_high=r.get("high"))
    if "sanity" in results:
        for r in results["sanity"].tables.get("methods", []):
            row(r["method"]).update(sanity=r.get("verdict"), sanity_rho=r.get("spearman_full"))
    return list(rows.values())


def _best(rows: list[dict[str, Any]], column: str) -> str | None:
    scored = [r for r in rows if _finite(r[column]) and r["method"] != "random"]
    return max(scored, key=lambda r: r[column])["method"] if scored else None


def disagreement(rows: list[dict[str, Any]]) -> str:
    """One sentence on where the paradigms disagree (or that they agree, or that fewer than two were measured)."""
    measured = [name for name, column in (("erasure", "erasure"), ("retraining", "racu"), ("sanity", "sanity"))
                if any(r[column] is not None for r in rows)]
    if len(measured) < 2:
        return f"Only {measured[0] if measured else 'no'} paradigm was measured: run faithfulness, roar and sanity to compare them."
    parts = []
    by_erasure, by_retraining = _best(rows, "erasure"), _best(rows, "racu")
    if by_erasure and by_retraining and by_erasure != by_retraining:
        parts.append(f"erasure ranks {by_erasure} first, retraining {by_retraining}")
    failing = [r["method"] for r in rows if r["sanity"] == "fails" and r["method"] != "random"]
    trusted = [m for m in failing if m in (by_erasure, by_retraining)]
    if trusted:
        parts.append(f"{', '.join(trusted)} ranks first by a faithfulness paradigm yet fails the randomisation check")
    unfaithful = [r["method"] for r in rows if _finite(r["racu"]) and _finite(r["racu_high"]) and r["racu_high"] < 0]
    if unfaithful:
        parts.append(f"retraining finds {', '.join(unfaithful)} worse than random")
    if not parts:
        return f"The paradigms measured ({', '.join(measured)}) agree on the best method and find no contradiction."
    return "The paradigms disagree: " + "; ".join(parts) + "."


def _interval(value: Any, low: Any, high: Any, digits: str) -> str:
    if not _finite(value):
        return "—"
    span = f" [{low:{digits}}, {high:{digits}}]" if _finite(low) and _finite(high) else ""
    return f"{value:{digits}}{span}"


def _sanity(row: dict[str, Any]) -> str:
    rho = f" (ρ = {fmt(row['sanity_rho'])})" if _finite(row["sanity_rho"]) else ""
    return f"{row['sanity'] or '—'}{rho}"


def paradigms_section(results: dict[str, Result]) -> str:
    """The report's section: the table, the disagreement sentence and the in-distribution caveat ("" without results)."""
    rows = paradigm_rows(results)
    if not rows:
        return ""
    head = ("<tr><th>method</th><th>erasure: AOPC comprehensiveness [95 % CI]</th><th>retraining: RACU % [95 % CI]</th>"
            "<th>sanity: randomisation verdict (ρ at full randomisation)</th></tr>")
    body = "".join(
        f"<tr><td>{esc(r['method'])}</td><td class=\"num\">{esc(_interval(r['erasure'], r['erasure_low'], r['erasure_high'], '.3f'))}</td>"
        f"<td class=\"num\">{esc(_interval(r['racu'], r['racu_low'], r['racu_high'], '.1f'))}</td>"
        f"<td>{esc(_sanity(r))}</td></tr>"
        for r in rows
    )
    caveat = ""
    summary = results["in-distribution"].summary if "in-distribution" in results else {}
    shares = {k: v for k, v in summary.items() if k.startswith("ood_share_random_")}
    if shares:
        top = max(shares, key=lambda k: float(k.rsplit("_", 1)[1]))
        caveat = (f"<p>Erased inputs and distribution shift: {shares[top]:.0%} of the inputs with {top.rsplit('_', 1)[1]} % of their "
                  "tokens masked are out of distribution for this model (in-distribution test), so the erasure column "
                  + ("mixes faithfulness with distribution shift.</p>" if shares[top] > 0.1 else "reads as faithfulness.</p>"))
    return ('<section id="paradigms"><h2>Faithfulness under each paradigm</h2>'
            f'<table class="verdict"><thead>{head}</thead><tbody>{body}</tbody></table>'
            f"<p><b>{esc(disagreement(rows))}</b></p>{caveat}</section>")
