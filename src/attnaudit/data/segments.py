"""Segments of a text as written: character spans ``[start, end)`` of its words, sentences, lines or paragraphs,
or spans given with the text (a JSONL field); checked, and made into one segment id per token from the tokenizer's
character offsets (:func:`token_segments`). No model here: :mod:`attnaudit.explain.helpers.segments` fills a
batch's ``segments`` from these.

No sentence splitter is installed beside attnaudit (neither nltk, pysbd, syntok nor spaCy is a dependency), so
sentences come from one documented regular expression (:data:`SENTENCE_END`): a sentence ends at ``.``, ``!``,
``?`` or ``…`` (repeated, possibly followed by closing quotes or brackets) before whitespace, or at a blank line.
It does not know abbreviations: ``Dr. Smith`` is two sentences; give spans in the JSONL where that matters.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from attnaudit.errors import AttnAuditError

UNITS = ("token", "word", "sentence", "line", "paragraph")
"""What ``--segments`` takes: ``token`` (every item its own feature, the default), or groups of tokens."""
WORD = re.compile(r"\w+(?:[-'’]\w+)*|[^\w\s]+")
"""A word: letters/digits (joined by inner hyphens or apostrophes), or a run of punctuation (``,``, ``...``)."""
SENTENCE_END = re.compile(r"(?:(?<=[.!?…])|(?<=[.!?…][\"'”’)\]])|(?<=[.!?…][\"'”’)\]]{2}))\s+|\n\s*\n")
"""Where one sentence ends and the next begins: after ``.``/``!``/``?``/``…`` (and closing quotes or brackets)
followed by whitespace, or at a blank line (a heading or list item without a full stop ends there)."""
PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n\s*")
"""Paragraphs are separated by one or more blank lines (lines holding only spaces or tabs count as blank)."""

Span = tuple[int, int]


def unit_spans(text: str, unit: str) -> list[Span]:
    """The spans of ``text``'s ``unit`` (``word``, ``sentence``, ``line``, ``paragraph``), in order, each without the
    whitespace around it; pieces holding only whitespace are left out."""
    unit = check_unit(unit)
    if unit == "word":
        return [m.span() for m in WORD.finditer(text)]
    if unit == "token":
        raise AttnAuditError("--segments token: every token is its own feature (no spans)")
    splitter = {"sentence": SENTENCE_END, "line": re.compile(r"\r?\n"), "paragraph": PARAGRAPH_BREAK}[unit]
    spans, start = [], 0
    for match in [*splitter.finditer(text), None]:
        end = len(text) if match is None else match.start()
        piece = text[start:end]
        if piece.strip():
            left = start + len(piece) - len(piece.lstrip())
            spans.append((left, start + len(piece.rstrip())))
        if match is not None:
            start = max(match.end(), end)
    return spans


def check_unit(unit: str) -> str:
    """``unit`` if it is one of :data:`UNITS`; a one-line error otherwise."""
    if unit not in UNITS:
        raise AttnAuditError(f"--segments: unknown unit {unit!r}; choose {', '.join(UNITS)} (or give spans in the JSONL)")
    return unit


def check_spans(text: str, spans: Any, where: str = "spans") -> list[Span]:
    """``spans`` (a list of ``[start, end)`` pairs of character offsets into ``text``) as tuples, in text order; a
    one-line error naming ``where`` for a value that is no list of integer pairs, an empty span, one outside the
    text or two that overlap."""
    if not isinstance(spans, (list, tuple)) or not spans:
        raise AttnAuditError(f"{where}: give a non-empty list of [start, end) character spans, got {spans!r}"[:200])
    out: list[Span] = []
    for span in spans:
        if not (isinstance(span, (list, tuple)) and len(span) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in span)):
            raise AttnAuditError(f"{where}: each span is a pair of integers [start, end), got {span!r}"[:200])
        start, end = int(span[0]), int(span[1])
        if start >= end:
            raise AttnAuditError(f"{where}: empty span [{start}, {end}) (start must be below end)")
        if start < 0 or end > len(text):
            raise AttnAuditError(f"{where}: span [{start}, {end}) lies outside the text ({len(text)} characters)")
        if not text[start:end].strip():
            raise AttnAuditError(f"{where}: span [{start}, {end}) holds only whitespace")
        out.append((start, end))
    ordered = sorted(out)
    for (a, b), (c, d) in zip(ordered, ordered[1:]):
        if c < b:
            raise AttnAuditError(f"{where}: spans [{a}, {b}) and [{c}, {d}) overlap")
    return ordered


def comparable(spans: Sequence[Span], unit: str) -> None:
    """A one-line error when a single text has fewer than two segments: nothing to compare."""
    if len(spans) < 2:
        what = f"one {unit}" if len(spans) == 1 else f"no {unit}"
        raise AttnAuditError(f"--segments {unit}: the text has {what}, so there is nothing to compare; choose a smaller unit")


def token_segments(text: str, offsets: Sequence[Span | None], spans: Sequence[Span]) -> list[int]:
    """The segment (index into ``spans``) of each token, from its character ``offsets`` into ``text`` (None: a
    special token); -1 for a token of no segment (specials, whitespace between segments, a prompt's template).
    A token belongs to the segment that holds most of its characters once the whitespace around it is left out
    (a BPE token ``" Dave"`` belongs to ``Dave``'s word); a token of whitespace only (``"\n"``) to the segment
    it lies inside, if any."""
    out = []
    for offset in offsets:
        if offset is None or offset[1] <= offset[0]:
            out.append(-1)
            continue
        a, b = offset
        piece = text[a:b]
        if piece.strip():
            a, b = a + len(piece) - len(piece.lstrip()), a + len(piece.rstrip())
            overlaps = [min(b, end) - max(a, start) for start, end in spans]
            best = max(range(len(spans)), key=overlaps.__getitem__, default=-1)
            out.append(best if best >= 0 and overlaps[best] > 0 else -1)
        else:
            out.append(next((i for i, (start, end) in enumerate(spans) if start <= a and b <= end), -1))
    return out
