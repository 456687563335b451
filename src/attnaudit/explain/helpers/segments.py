"""Segments on a batch (``Batch.segments``): which word, sentence, line, paragraph or given span each token belongs
to, computed from the text as written (:func:`~attnaudit.data.types.text_of`) through the tokenizer's character
offsets (a Hugging Face encoder or decoder, a zero-shot prompt's ``{text}``), or word by word for attnaudit's own
word-level models (there a word is a token).

Each example's spans are its ``meta["spans"]`` when given (a JSONL ``spans`` field, or ``--segments`` with a JSON
list of spans), else those of the unit; they are kept on the example (``meta["segment_spans"]``) so that the views
name each segment by its text (:func:`segment_names`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from attnaudit.data.segments import Span, check_spans, check_unit, comparable, token_segments, unit_spans
from attnaudit.data.types import Batch, Example, text_of, word_spans
from attnaudit.errors import AttnAuditError, warn
from attnaudit.explain.helpers.items import hierarchical
from attnaudit.models.interface import AttentionModel
from attnaudit.run import Run

SPANS = "segment_spans"
"""``Example.meta`` key: the spans the example's segments were made from (segment ``i`` is ``spans[i]``)."""


def example_spans(example: Example, unit: str) -> list[Span]:
    """The spans of ``example``'s segments: its given ``meta["spans"]`` (checked), else its text's ``unit``."""
    text = text_of(example)
    given = example.meta.get("spans")
    if given is not None:
        return check_spans(text, given, f"{example.meta.get('source', 'the text')}: spans")
    return unit_spans(text, unit)


def add_segments(model: AttentionModel, batch: Batch, unit: str, prompt: str | None = None) -> Batch:
    """``batch`` with ``segments`` ``(B,T)`` filled (-1 outside every segment); ``unit`` ``token`` (and no given
    spans) leaves it None: every item is its own feature. ``prompt``: the zero-shot template the text was put in
    (``{text}`` marks where). A row whose tokens cannot be aligned with its text keeps one segment per item (warned)."""
    if unit != "span":  # "span": the examples' given spans
        check_unit(unit)
    if unit == "token" and not any("spans" in ex.meta for ex in batch.examples):
        return batch
    if hierarchical(model):
        raise AttnAuditError("--segments: this model's items are sentences already (HAN)")
    if batch.tokens.dim() != 2 or len(batch.examples) != len(batch.tokens):
        raise AttnAuditError("--segments: this batch has no text to segment")
    segments = torch.full(batch.tokens.shape, -1, dtype=torch.long)
    unaligned = 0
    for row, example in enumerate(batch.examples):
        real = batch.tokens[row][batch.mask[row].bool()].tolist()
        if unit == "token" and "spans" not in example.meta:  # no spans given for this row: each token its own segment
            segments[row, : len(real)] = torch.arange(len(real))
            continue
        own_words = word_spans(example) if unit == "word" and model.tokenizer is None and "spans" not in example.meta else None
        spans = own_words if own_words is not None else example_spans(example, unit)  # a word-level model: its words are its tokens
        offsets = token_offsets(model, example, real, prompt)
        if offsets is None:
            unaligned += 1
            segments[row, : len(real)] = torch.arange(len(real))
            example.meta.pop(SPANS, None)
            continue
        shift, places = offsets
        moved = [(a + shift, b + shift) for a, b in spans]
        full = fill(prompt, text_of(example)) if prompt else text_of(example)
        segments[row, : len(real)] = torch.tensor(token_segments(full, places, moved), dtype=torch.long)
        example.meta[SPANS] = spans
    if unaligned:
        warn(f"--segments: {unaligned} of {len(batch)} texts could not be aligned with their tokens; their tokens are their own segments")
    batch.segments = segments.to(batch.tokens.device)
    return batch


def fill(prompt: str, text: str) -> str:
    """``prompt`` with its ``{text}`` replaced by ``text`` (as the zero-shot collator fills it)."""
    return prompt.replace("{text}", text)


def token_offsets(model: AttentionModel, example: Example, ids: Sequence[int], prompt: str | None) -> tuple[int, list[Span | None]] | None:
    """Where the text starts in what was tokenised (the filled prompt) and each token's character span there
    (None: a special token, a pair's second text); None when the tokens cannot be aligned with the text."""
    text = text_of(example)
    tokenizer = model.tokenizer
    if tokenizer is None:  # attnaudit's own word-level models: a token is a word of the example
        spans = word_spans(example)
        if spans is None or len(ids) > len(spans):
            return None
        return 0, list(spans[: len(ids)])
    if not getattr(tokenizer, "is_fast", False):
        return None
    full, shift = (fill(prompt, text), prompt.index("{text}")) if prompt and "{text}" in prompt else (text, 0)
    query = example.meta.get("query_text") or (" ".join(example.query) if example.query else None)
    for specials in (True, False):
        encoded = tokenizer(full, query, add_special_tokens=specials, return_offsets_mapping=True)
        found = list(encoded["input_ids"])
        sides = encoded.sequence_ids() if hasattr(encoded, "sequence_ids") else [0] * len(found)
        places: list[Span | None] = [tuple(o) if side == 0 else None for o, side in zip(encoded["offset_mapping"], sides)]
        if specials and found[: len(ids)] == list(ids):
            return shift, places[: len(ids)]
        if not specials:
            start = _find(list(ids), found)
            if start is not None:
                return shift, [None] * start + places + [None] * (len(ids) - start - len(found))
    return None


def _find(row: list[int], part: list[int]) -> int | None:
    """The first position where ``part`` runs contiguously in ``row``; None if nowhere (or ``part`` is empty)."""
    for start in range(len(row) - len(part) + 1):
        if part and row[start : start + len(part)] == part:
            return start
    return None


def segment_names(example: Example) -> list[str] | None:
    """The text of each of ``example``'s segments (in segment order), or None when it has none recorded."""
    spans = example.meta.get(SPANS)
    if not spans:
        return None
    text = text_of(example)
    return [text[a:b] for a, b in spans]


class Segmenting:
    """A run's collate function that also fills ``Batch.segments`` (``--segments`` on a test or an audit): every other
    attribute is the wrapped collator's."""

    def __init__(self, collate: Callable[[list[Example]], Batch], model: AttentionModel, unit: str) -> None:
        self.inner, self.model, self.unit = collate, model, check_unit(unit)

    def __call__(self, examples: list[Example]) -> Batch:
        return add_segments(self.model, self.inner(examples), self.unit, getattr(self.inner, "prompt", None))

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


def replacements(text: str) -> dict[str, str]:
    """``--replace "Dave=Sarah,Paris=Rome"`` as ``{"Dave": "Sarah", ...}``: counterfactual texts for the segments whose
    text is a key; a one-line error for a pair without ``=`` or an empty segment text."""
    out: dict[str, str] = {}
    for pair in (p for p in text.split(",") if p.strip()):
        segment, sep, replacement = pair.partition("=")
        if not sep or not segment.strip():
            raise AttnAuditError(f"--replace: give SEGMENT=REPLACEMENT pairs separated by commas, got {pair!r}"[:200])
        out[segment.strip()] = replacement.strip()
    if not out:
        raise AttnAuditError("--replace: give SEGMENT=REPLACEMENT pairs separated by commas")
    return out


def replacement_ids(model: AttentionModel, first_id: int, replacement: str) -> list[int]:
    """The tokens that stand for ``replacement`` in place of a segment whose first token is ``first_id``: the
    tokenisation of the replacement text, with a leading space where that token carries one (a byte-level BPE's
    ``" Dave"`` becomes ``" Sarah"``, not ``"Sarah"``). An empty replacement removes the segment."""
    tokenizer = model.tokenizer
    if tokenizer is None:
        raise AttnAuditError("--replace needs a subword tokenizer (a Hugging Face model); give --baseline for attnaudit's own models")
    if not replacement:
        return []
    lead = " " if tokenizer.decode([first_id])[:1].isspace() else ""
    return list(tokenizer(lead + replacement, add_special_tokens=False)["input_ids"])


def perturbed_rows(batch: Batch, rows: Sequence[tuple[int, Sequence[int], Sequence[int] | None]], pad_id: int) -> Batch:
    """One instance per ``(row, positions, tokens)``: row ``row`` of ``batch`` with the tokens at ``positions`` (a
    segment) removed (``tokens`` None or empty) or replaced, as one run, by ``tokens`` (a baseline token per position,
    a replacement text's tokens); token types follow the first replaced position; the query and target stay."""
    sequences, features = [], []
    for row, positions, fresh_tokens in rows:
        real = batch.mask[row].bool()
        ids = batch.tokens[row][real].tolist()
        types = batch.features[row][real].tolist() if batch.features is not None else [0] * len(ids)
        gone = set(positions)
        first = min(gone)
        fresh = list(fresh_tokens or [])
        sequences.append([*ids[:first], *fresh, *(t for p, t in enumerate(ids) if p > first and p not in gone)])
        features.append([*types[:first], *[types[first]] * len(fresh), *(k for p, k in enumerate(types) if p > first and p not in gone)])
    width = max(1, max(map(len, sequences)))
    tokens = torch.full((len(rows), width), pad_id, dtype=batch.tokens.dtype)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    feats = torch.zeros(len(rows), width, dtype=torch.long)
    for i, (sequence, kinds) in enumerate(zip(sequences, features)):
        tokens[i, : len(sequence)] = torch.tensor(sequence, dtype=batch.tokens.dtype)
        mask[i, : len(sequence)] = True
        feats[i, : len(kinds)] = torch.tensor(kinds, dtype=torch.long)
    index = torch.tensor([row for row, _, _ in rows], dtype=torch.long, device=batch.tokens.device)
    device = batch.tokens.device
    return Batch(
        tokens=tokens.to(device), mask=mask.to(device), features=None if batch.features is None else feats.to(device),
        query=None if batch.query is None else batch.query[index],
        query_mask=None if batch.query_mask is None else batch.query_mask[index],
        target=None if batch.target is None else batch.target[index],  # an encoder-decoder's forced target prefix
        target_mask=None if batch.target_mask is None else batch.target_mask[index],
    )


def text_segments(text: str, segments: str | Sequence[Sequence[int]] | None) -> tuple[str, list[Span] | None]:
    """``--segments`` for one text, checked before any model is loaded: ``(unit, spans)``; ``spans`` None for
    ``token`` (each token its own feature). A unit name, or spans as a list (or a JSON list) of ``[start, end)``
    character offsets. One-line errors: an unknown unit, bad spans, fewer than two segments (nothing to compare)."""
    if segments is None:
        return "token", None
    if isinstance(segments, str) and not segments.strip().startswith("["):
        unit = check_unit(segments.strip())
        if unit == "token":
            return unit, None
        spans = unit_spans(text, unit)
        comparable(spans, unit)
        return unit, spans
    if isinstance(segments, str):
        import json

        try:
            segments = json.loads(segments)
        except ValueError as error:
            raise AttnAuditError(f"--segments: not a unit nor a JSON list of [start, end) spans ({error.args[0][:60]})") from None
    spans = check_spans(text, segments, "--segments")
    comparable(spans, "span")
    return "span", spans


def segment_text(model: AttentionModel, batch: Batch, text: str, unit: str, spans: list[Span], prompt: str | None) -> Batch:
    """``batch`` of the one ``text`` with its segments (``spans``) filled; a one-line error when its tokens cannot be
    aligned with the text (nothing would be grouped)."""
    example = batch.examples[0] if batch.examples else Example(tokens=text.split(), meta={"text": text})
    if text_of(example) != text:
        example = Example(tokens=text.split(), meta={"text": text})
    if unit != "word" or model.tokenizer is not None:  # a word-level model's words are its tokens (add_segments)
        example.meta["spans"] = [list(span) for span in spans]
    batch.examples = [example]
    real = batch.tokens[0][batch.mask[0].bool()].tolist()
    if token_offsets(model, example, real, prompt) is None:
        raise AttnAuditError(f"--segments {unit}: the model's tokens cannot be aligned with the text's characters (a slow tokenizer, a cut text)")
    return add_segments(model, batch, unit, prompt)


def segment_spans(example: Example) -> list[Span] | None:
    """The spans ``example``'s segments were made from (segment ``i`` is ``spans[i]``), None when it has none."""
    spans = example.meta.get(SPANS)
    return [(int(span[0]), int(span[1])) for span in spans] if spans else None


def check_replaced(names: Sequence[str], replace: str) -> None:
    """A one-line error naming a ``--replace`` key that no segment (or token) of the text reads."""
    given = {name.strip().casefold() for name in names}
    missing = [key for key in replacements(replace) if key.casefold() not in given]
    if missing:
        shown = ", ".join(repr(name.strip()) for name in names[:12])
        raise AttnAuditError(f"--replace: no segment reads {missing[0]!r}; the segments are {shown}"[:300])


def segmented(run: Run, unit: str | None) -> Run:
    """``run`` whose batches carry segments of ``unit`` (``run <test> --segments``, ``audit --segments``): its collate
    function wrapped (:class:`Segmenting`); ``None`` or ``token`` (without spans given in the data) leave it as it is."""
    if unit is None:
        return run
    check_unit(unit)
    if hierarchical(run.model):
        raise AttnAuditError("--segments: this model's items are sentences already (HAN)")
    if isinstance(run.collate, Segmenting):
        run = replace(run, collate=run.collate.inner)
    return replace(run, collate=Segmenting(run.collate, run.model, unit))


def segment_unit(run: Run) -> str | None:
    """The unit ``run``'s batches are segmented by (:func:`segmented`), None when they are not."""
    return run.collate.unit if isinstance(run.collate, Segmenting) else None
