"""``generation.html``: a generated sequence explained step by step as one offline page (``explain --generate`` /
``--target``).

The prompt's (an encoder-decoder's source's) tokens and the generated ones; hovering or clicking a generated token
shades every item that step reads (the prompt's or source's tokens and the earlier generated ones) by the step's score
under the chosen method (orange positive, blue negative, each step scaled to its own largest magnitude) and shows the
step's probability, entropy, rank and contrast; with ``--aggregate`` each token can be shaded by its word's merged
score instead. The steps, the run's facts, the methods' settings (``meta["definitions"]``) and the skipped methods
are static tables, readable without JavaScript.

Safety as in the report's explorer (:mod:`attnaudit.report.explorer`): the data travels as JSON in
``<script type="application/json">`` with ``<``, ``>`` and ``&`` escaped, ``generation.js`` builds the view with DOM
nodes and ``textContent`` only, and the Content-Security-Policy allows no network and only that script (its hash).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from attnaudit.explain.registry import EXPLANATIONS
from attnaudit.html_page import SIZE, esc, fmt, page, round_sig, script_json, table


class Generated(Protocol):
    """What the page reads of :class:`attnaudit.explain.generation.Generated` (named structurally: that module writes
    this page, so this one does not import it)."""

    source: list[str]
    target: list[str]
    steps: list[dict[str, Any]]
    scores: dict[str, list[list[float]]]
    items: list[list[dict[str, Any]]]
    skipped: dict[str, str]
    meta: dict[str, Any]

    def words(self, how: str = "sum") -> pd.DataFrame: ...

SCALARS = (str, int, float, bool, type(None))
TEXTS = ("token", "top", "contrast")
"""Step fields that are token text: quoted in the steps table, so a newline or a space shows."""


def finite(value: Any) -> Any:
    """``value`` with every non-finite float as None (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def word_view(generated: Generated, how: str) -> dict[str, Any]:
    """Per method, step and item the merged score of the item's word (:meth:`Generated.words` by ``how``), and per
    step and item that word as written."""
    words = generated.words(how)
    merged = {(r.method, r.step, r.side, r.word): r.score for r in words.itertuples()}
    text = {(r.step, r.side, r.word): r.token for r in words.itertuples()}
    keys = [[(item["side"], item["word"]) for item in items] for items in generated.items]
    return {
        "how": how,
        "scores": {m: [[round_sig(merged[(m, t, *key)]) for key in step] for t, step in enumerate(keys)] for m in generated.scores},
        "text": [[text[(t, *key)] for key in step] for t, step in enumerate(keys)],
    }


ITEM_KEYS = ("position", "positions", "side", "word", "token")
"""What the page reads of an item (``positions``: every token of a segment, which its score shades)."""


def payload(generated: Generated, aggregate: str | None) -> dict[str, Any]:
    """What ``generation.js`` draws: tokens, items, scores (4 significant digits), step records, word scores."""
    return finite({
        "source": generated.source, "target": generated.target, "kind": generated.meta.get("kind"),
        "items": [[{k: item[k] for k in ITEM_KEYS if k in item} for item in items] for items in generated.items],
        "scores": {m: [[round_sig(v) for v in step] for step in steps] for m, steps in generated.scores.items()},
        "about": {m: EXPLANATIONS[m].about for m in generated.scores if m in EXPLANATIONS},
        "steps": generated.steps,
        "words": word_view(generated, aggregate) if aggregate is not None and generated.scores else None,
    })


def definitions(meta: dict[str, Any]) -> str:
    """The run's facts (every plain value of ``meta``) and each method's settings (``meta["definitions"]``)."""
    facts = [{"fact": key, "value": value} for key, value in meta.items() if isinstance(value, SCALARS) and value not in (None, "")]
    settings = [
        {"method": method, "option": option, "value": value}
        for method, options in (meta.get("definitions") or {}).items()
        for option, value in options.items()
    ]
    parts = ["<h3>Run</h3>" + table(facts, limit=len(facts))]
    if settings:
        parts.append("<h3>Methods' settings</h3>" + table(settings, limit=len(settings)))
    return "".join(parts)


def generation_page(generated: Generated, aggregate: str | None = None) -> str:
    """The whole page for ``generated`` (``aggregate``: also offer word scores merged so)."""
    meta = generated.meta
    named = meta.get("source") or meta.get("model") or "model"
    title = f"Generated tokens explained: {'/'.join(Path(str(named)).parts[-2:])}"
    facts = [f"{esc(k)}: {fmt(meta[k])}" for k in ("mode", "kind", "explained") if meta.get(k) not in (None, "")]
    skipped = "".join(f"<li><b>{esc(name)}</b>: {esc(reason)}</li>" for name, reason in generated.skipped.items())
    steps = [{k: json.dumps(v, ensure_ascii=False) if k in TEXTS else v for k, v in record.items()} for record in generated.steps]
    body = [
        f'<header><h1>{esc(title)}</h1><p class="meta">{" · ".join([*facts, f"page size: {SIZE}"])}</p></header>',
        '<section id="sequence"><h2>Each generated token explained</h2>',
        "<p>Hover over a generated token to see what explains it, click to keep it: every token the step reads (the "
        "prompt's or source's and the earlier generated ones) is shaded by its score under the chosen method (orange: "
        "positive, blue: negative, each step scaled to its own largest magnitude; hover a token for its value). "
        f"Items: {esc(meta.get('items', 'the tokens each step reads'))}.</p>",
        '<noscript><p class="muted">The view of each step needs JavaScript; generation.csv holds every score, '
        "and the tables below are plain HTML.</p></noscript>",
        f'<script type="application/json" id="generation-data">{script_json(payload(generated, aggregate))}</script>',
        '<div id="gv-root"></div></section>',
        f'<section id="steps"><h2>Steps</h2>{table(steps, limit=max(len(steps), 1))}</section>',
        f'<section id="definitions"><h2>Definitions</h2>{definitions(meta)}',
        f'<h3>Skipped methods</h3><ul class="notes">{skipped}</ul>' if skipped else "",
        "</section>",
    ]
    return page(title, "".join(body))
