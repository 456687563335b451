"""A rationale's scoring units: the words of an instance's items (wordpieces of a Hugging Face model grouped by word)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from attnaudit.data.types import Batch, Example, text_of, word_spans
from attnaudit.run import Run


@dataclass
class Units:
    """How the items of one instance map onto scoring units and which units are rationale.

    ``item_unit[i]``: the unit of item ``i`` (-1: none, e.g. ``[CLS]``); ``positive``: bool per unit.
    """

    item_unit: np.ndarray
    positive: np.ndarray

    def scores(self, item_scores: np.ndarray) -> np.ndarray:
        """Per-unit magnitude: ``|score|`` summed over the unit's items."""
        out = np.zeros(self.positive.size)
        keep = self.item_unit >= 0
        np.add.at(out, self.item_unit[keep], np.abs(item_scores[: self.item_unit.size][keep]))
        return out


def hf_word_ids(run: Run, ex: Example, ids: list[int]) -> np.ndarray | None:
    """Word index of each wordpiece of ``ex`` (-1 for special tokens, the query and pieces of no word), from the
    tokenizer's character offsets into the text as the collator gave it (:func:`~attnaudit.data.types.text_of`)
    and the words' spans in it; None if it cannot be aligned."""
    tokenizer = run.model.tokenizer  # called for the hf family only
    spans = word_spans(ex)
    if not getattr(tokenizer, "is_fast", False) or spans is None:
        return None
    pair = [text_of(ex, query=True)] if run.task.task_type == "pair" and ex.query else None
    enc = tokenizer([text_of(ex)], pair, truncation=True, max_length=len(ids), return_offsets_mapping=True)
    if enc["input_ids"][0] != ids:
        return None  # the collator tokenised differently (a prompt, a cut): no safe alignment
    starts = [a for a, _ in spans]
    owners = []
    for sequence, (a, b) in zip(enc.sequence_ids(0), enc["offset_mapping"][0]):
        word = bisect.bisect_right(starts, max(b - 1, a)) - 1  # the word holding the piece's last character
        inside = sequence == 0 and b > a and word >= 0 and a < spans[word][1] and b > spans[word][0]
        owners.append(word if inside else -1)
    return np.array(owners, dtype=int)


def instance_units(run: Run, batch: Batch, row: int) -> Units | None:
    """Scoring units of instance ``row`` of ``batch``; None when the example has no usable rationale."""
    ex = batch.examples[row]
    rationale = set(ex.rationale or [])
    if not rationale:
        return None
    mask = batch.mask[row]
    if run.family == "han":
        n_sent = int(mask.any(-1).sum())
        lengths = [len(s) for s in (ex.sentences or [ex.tokens])][:n_sent]
        starts = np.cumsum([0, *lengths])
        positive = np.array([any(a <= r < b for r in rationale) for a, b in zip(starts[:-1], starts[1:])])
        return Units(np.arange(n_sent), positive)
    n_items = int(mask.sum())
    if run.family == "hf":
        word_of = hf_word_ids(run, ex, batch.tokens[row, :n_items].tolist())
        if word_of is None:
            return None
        n_words = int(word_of.max()) + 1 if (word_of >= 0).any() else 0
        return Units(word_of, np.isin(np.arange(n_words), list(rationale)))
    n_words = min(n_items, len(ex.tokens))
    return Units(np.arange(n_words), np.isin(np.arange(n_words), list(rationale)))
