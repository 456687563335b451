"""Turning examples into padded tensors, and iterating over them in batches."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence

import torch

from attnaudit.data.types import Batch, Example, TaskType
from attnaudit.data.vocab import Vocab
from attnaudit.errors import AttnAuditError, InputError, warn

IGNORE_INDEX = -100  # torch.nn.CrossEntropyLoss's default ignore_index
SENTENCE_END = frozenset({".", "!", "?"})


def _where(example: Example) -> str:
    return str(example.meta.get("source", "<example>"))


def split_sentences(tokens: Sequence[str]) -> list[list[str]]:
    """Split a token list after each ``.``, ``!`` or ``?`` (for HAN when no sentences are given)."""
    sentences: list[list[str]] = [[]]
    for token in tokens:
        sentences[-1].append(token)
        if token in SENTENCE_END:
            sentences.append([])
    return [s for s in sentences if s]


def _pad(rows: Sequence[Sequence[int]], value: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, mask)`` of shape ``(len(rows), max_len)``; mask True at real positions."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), value, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = True
    return ids, mask


def length_groups(lengths: torch.Tensor, slack: float = 0.1, floor: int = 0) -> list[torch.Tensor]:
    """Instance indices in groups of similar length, longest first: a group grows while padding every
    member to its longest keeps the positions computed within ``1 + slack`` of the real ones, so a
    batched computation whose cost scales with the padded width (Integrated Gradients runs it once per
    step) does not spend it on padding; and, whatever its padding, while it holds at most ``floor``
    positions (a pass that small costs its fixed overhead more than its padding)."""
    order = torch.argsort(lengths, descending=True, stable=True).tolist()
    sizes = lengths.tolist()
    groups: list[list[int]] = []
    real = 0  # real positions of the last group
    for i in order:
        padded = max(sizes[groups[-1][0]], 1) * (len(groups[-1]) + 1) if groups else 0
        if groups and (padded <= (1 + slack) * (real + sizes[i]) or padded <= floor):
            groups[-1].append(i)
            real += sizes[i]
        else:
            groups.append([i])
            real = sizes[i]
    return [torch.tensor(group, dtype=torch.long) for group in groups]


class Collator:
    """Build a :class:`Batch` from examples for one task type.

    ``labels`` fixes the label (or tag) ids. ``max_len`` truncates token sequences (per
    sentence for hierarchical models), with one warning per call. Examples with an
    unknown label raise :class:`InputError` naming their ``path:line``. When no example
    in a call has a label (unlabelled prediction input), ``Batch.labels`` is None.
    """

    def __init__(
        self,
        vocab: Vocab,
        labels: Sequence[str],
        task_type: TaskType,
        hierarchical: bool = False,
        max_len: int | None = None,
        feature_vocab: Vocab | None = None,
    ) -> None:
        if task_type == "seq2seq":
            raise AttnAuditError("Collator handles classification, pair and tagging tasks, not seq2seq")
        if max_len is not None and max_len < 1:
            raise AttnAuditError(f"max_len must be at least 1, got {max_len}")
        self.vocab = vocab
        self.labels = list(labels)
        self.label_ids = {label: i for i, label in enumerate(self.labels)}
        self.task_type = task_type
        self.hierarchical = hierarchical
        self.max_len = max_len
        self.feature_vocab = feature_vocab

    def _label_id(self, example: Example, label: str) -> int:
        if label not in self.label_ids:
            known = ", ".join(self.labels[:20]) + (", ..." if len(self.labels) > 20 else "")
            raise InputError(_where(example), f"unknown label {label!r}; known: {known}")
        return self.label_ids[label]

    def _cut(self, seq: Sequence[str]) -> tuple[list[str], bool]:
        if self.max_len is not None and len(seq) > self.max_len:
            return list(seq[: self.max_len]), True
        return list(seq), False

    def __call__(self, examples: Sequence[Example]) -> Batch:
        if not examples:
            raise AttnAuditError("cannot build a batch from no examples")
        truncated = 0
        for ex in examples:
            if not ex.tokens:
                raise InputError(_where(ex), "example has no tokens")
        if self.hierarchical:
            tokens, mask, truncated = self._hierarchical(examples)
            length = [len(ex.tokens) for ex in examples]
        else:
            cut = [self._cut(ex.tokens) for ex in examples]
            truncated += sum(was_cut for _, was_cut in cut)
            length = [len(seq) for seq, _ in cut]
            tokens, mask = _pad([self.vocab.encode(seq) for seq, _ in cut])
        batch = Batch(tokens=tokens, mask=mask, examples=list(examples))

        if self.task_type == "tagging":
            batch.labels = self._tags(examples, length)
        else:
            batch.labels = self._class_labels(examples)
        if self.task_type == "pair":
            queries = []
            for ex in examples:
                if not ex.query:
                    raise InputError(_where(ex), "pair example without a query / second sentence")
                query, was_cut = self._cut(ex.query)
                truncated += was_cut
                queries.append(self.vocab.encode(query))
            batch.query, batch.query_mask = _pad(queries)
        if self.feature_vocab is not None and not self.hierarchical:
            rows = []
            for ex, n in zip(examples, length):
                feats = ex.meta.get("features")
                if feats is None or len(feats) != len(ex.tokens):
                    raise InputError(_where(ex), "missing or misaligned per-token features")
                rows.append(self.feature_vocab.encode(feats[:n]))
            batch.features, _ = _pad(rows)
        if truncated:
            warn(
                f"{truncated} of {len(examples)} examples had sequences longer than "
                f"max_len={self.max_len}; truncated"
            )
        return batch

    def _class_labels(self, examples: Sequence[Example]) -> torch.Tensor | None:
        if all(ex.label is None for ex in examples):
            return None
        ids = []
        for ex in examples:
            if ex.label is None:
                raise InputError(_where(ex), "example without a label in a labelled batch")
            ids.append(self._label_id(ex, ex.label))
        return torch.tensor(ids, dtype=torch.long)

    def _tags(self, examples: Sequence[Example], length: list[int]) -> torch.Tensor | None:
        if all(ex.tags is None for ex in examples):
            return None
        rows = []
        for ex, n in zip(examples, length):
            if ex.tags is None or len(ex.tags) != len(ex.tokens):
                raise InputError(_where(ex), "tags missing or not one per token")
            rows.append([self._label_id(ex, tag) for tag in ex.tags[:n]])
        labels, _ = _pad(rows, IGNORE_INDEX)
        return labels

    def _hierarchical(self, examples: Sequence[Example]) -> tuple[torch.Tensor, torch.Tensor, int]:
        """``(B,S,W)`` ids and mask from ``sentences`` (or tokens split at sentence ends)."""
        docs: list[list[list[int]]] = []
        truncated = 0
        for ex in examples:
            sentences = [s for s in (ex.sentences or split_sentences(ex.tokens)) if s]
            if not sentences:
                raise InputError(_where(ex), "example has no sentences")
            doc = []
            was_cut = False
            for sentence in sentences:
                words, cut = self._cut(sentence)
                was_cut |= cut
                doc.append(self.vocab.encode(words))
            truncated += was_cut
            docs.append(doc)
        n_sent = max(len(d) for d in docs)
        n_word = max(len(s) for d in docs for s in d)
        tokens = torch.zeros((len(docs), n_sent, n_word), dtype=torch.long)
        mask = torch.zeros((len(docs), n_sent, n_word), dtype=torch.bool)
        for b, doc in enumerate(docs):
            for s, ids in enumerate(doc):
                tokens[b, s, : len(ids)] = torch.tensor(ids, dtype=torch.long)
                mask[b, s, : len(ids)] = True
        return tokens, mask, truncated


def iterate_batches(
    examples: Sequence[Example],
    collate: Callable[[list[Example]], Batch],
    batch_size: int,
    shuffle: bool = False,
    seed: int = 0,
    bucket: bool = True,
) -> Iterator[Batch]:
    """Batches of ``examples``.

    Without ``shuffle`` the original order is kept (so predictions line up with inputs).
    With it, examples are permuted with ``seed``; with ``bucket`` each chunk of 50
    batches is then sorted by length (less padding) and the batches' order shuffled.
    Pass ``seed + epoch`` for a new order each epoch.
    """
    if batch_size < 1:
        raise AttnAuditError(f"batch size must be at least 1, got {batch_size}")
    order = list(range(len(examples)))
    batches: list[list[int]] = []
    if shuffle:
        rng = random.Random(seed)
        rng.shuffle(order)
        chunk = 50 * batch_size if bucket else len(order) or 1
        for start in range(0, len(order), chunk):
            part = order[start : start + chunk]
            if bucket:
                part.sort(key=lambda i: len(examples[i].tokens))
            batches += [part[i : i + batch_size] for i in range(0, len(part), batch_size)]
        if bucket:
            rng.shuffle(batches)
    else:
        batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    for indices in batches:
        yield collate([examples[i] for i in indices])
