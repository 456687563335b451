"""Examples, datasets and batches shared by readers, models and experiments."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

TaskType = Literal["classification", "pair", "tagging", "seq2seq"]


@dataclass
class Example:
    """One instance. ``tokens`` is the text (for HAN, ``sentences`` splits it).

    ``label`` is the class name (classification / pair / QA); ``tags`` the per-token
    labels (tagging); ``query`` the second sentence or question (pair / QA);
    ``rationale`` the indices of tokens known to matter (synthetic tasks, SST phrases);
    ``target`` the target-side tokens (seq2seq); ``meta`` anything else (source line...).
    """

    tokens: list[str]
    label: str | None = None
    tags: list[str] | None = None
    query: list[str] | None = None
    sentences: list[list[str]] | None = None
    rationale: list[int] | None = None
    target: list[str] | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def text_of(example: Example, query: bool = False) -> str:
    """The example's text as written (``meta["text"]``, ``meta["query_text"]`` for the second text), else its
    words joined by spaces (readers whose files hold words, not text: SST's trees, CoNLL, bAbI, SNLI).
    What a subword tokenizer reads: a language model sees ``a warm, funny``, not ``a warm , funny``."""
    written = example.meta.get("query_text" if query else "text")
    if isinstance(written, str) and written:
        return written
    return " ".join(map(str, (example.query or []) if query else example.tokens))


def word_spans(example: Example, query: bool = False) -> list[tuple[int, int]] | None:
    """Character span ``[start, end)`` of each word (``tokens`` or ``query``) in :func:`text_of`; None where
    the words cannot be found in order in the text (case-insensitively, as the readers lower-case them)."""
    words = [str(w) for w in ((example.query or []) if query else example.tokens)]
    text = text_of(example, query)
    folded = text.lower()
    if len(folded) != len(text):  # a character whose lower case is longer: offsets would drift
        return None
    spans, position = [], 0
    for word in words:
        start = folded.find(word.lower(), position)
        if start < 0:
            return None
        spans.append((start, start + len(word)))
        position = start + len(word)
    return spans


@dataclass
class TaskData:
    """A task's splits plus what models need to know about it."""

    name: str
    task_type: TaskType
    train: list[Example]
    dev: list[Example]
    test: list[Example]
    labels: list[str]
    notes: list[str] = field(default_factory=list)

    def split(self, name: str) -> list[Example]:
        from attnaudit.errors import AttnAuditError

        if name == "all":  # every instance: for a model not trained on these data (zero-shot, a pretrained model)
            return [*self.train, *self.dev, *self.test]
        if name not in ("train", "dev", "test"):
            raise AttnAuditError(f"unknown split {name!r}; choose train, dev, test or all")
        return getattr(self, name)


@dataclass
class Batch:
    """Padded tensors for a list of examples.

    ``tokens`` (B,T) ids — for HAN (B,S,W); ``mask`` same shape, True at real tokens;
    ``labels`` (B,) or (B,T) with -100 at padding; ``features`` (B,T) ids of an optional
    per-token feature (POS tags for CoNLL); ``query``/``query_mask`` (B,Q) for the
    pair/QA models; ``target``/``target_mask`` for seq2seq; ``examples`` the originals;
    ``items`` (B,T) bool, True at the tokens an explanation ranks when those are only part of
    the real tokens (a zero-shot prompt's ``{text}`` span), None when every real token is one;
    ``explained`` (B,) the class each row's explanation is of (a generated or forced token; None:
    the predicted class) and ``contrast`` (B,) a foil: then ``p(explained) − p(contrast)`` is explained;
    ``segments`` (B,T) long, the segment (a group of tokens explained as one feature: a word, sentence,
    line, ...) each position belongs to, -1 outside every segment; None: each item is its own feature;
    ``roles`` (B,T) long, a chat-rendered prompt's role of each position (an index into
    :data:`attnaudit.models.hf.chat.ROLES`: system, user, template, assistant; -1 at padding), None without a chat template.
    """

    tokens: Tensor
    mask: Tensor
    labels: Tensor | None = None
    features: Tensor | None = None
    query: Tensor | None = None
    query_mask: Tensor | None = None
    target: Tensor | None = None
    target_mask: Tensor | None = None
    examples: list[Example] = field(default_factory=list)
    items: Tensor | None = None
    explained: Tensor | None = None
    contrast: Tensor | None = None
    segments: Tensor | None = None
    roles: Tensor | None = None

    def to(self, device: torch.device | str) -> Batch:
        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device)

        return Batch(
            tokens=self.tokens.to(device),
            mask=self.mask.to(device),
            labels=move(self.labels),
            features=move(self.features),
            query=move(self.query),
            query_mask=move(self.query_mask),
            target=move(self.target),
            target_mask=move(self.target_mask),
            examples=self.examples,
            items=move(self.items),
            explained=move(self.explained),
            contrast=move(self.contrast),
            segments=move(self.segments),
            roles=move(self.roles),
        )

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def select(self, index: Tensor) -> Batch:
        """Instances ``index`` (1-D), their ``(B,T)`` tensors cut after the last position real in any of them.

        For computing on a group of similar lengths without the others' padding (2-D tokens; a query and a
        target keep their width)."""
        real = self.mask[index].any(0).nonzero()
        width = int(real.max()) + 1 if len(real) else 1

        def take(t: Tensor | None, per_position: bool = False) -> Tensor | None:
            if t is None:
                return None
            picked = t[index.to(t.device)]
            return picked[:, :width] if per_position and picked.dim() >= 2 else picked

        return Batch(
            tokens=self.tokens[index][:, :width],
            mask=self.mask[index][:, :width],
            labels=take(self.labels, per_position=True),
            features=take(self.features, per_position=True),
            query=take(self.query),
            query_mask=take(self.query_mask),
            target=take(self.target),
            target_mask=take(self.target_mask),
            examples=[self.examples[i] for i in index.tolist()] if self.examples else [],
            items=take(self.items, per_position=True),
            explained=take(self.explained),
            contrast=take(self.contrast),
            segments=take(self.segments, per_position=True),
            roles=take(self.roles, per_position=True),
        )
