"""Batches for Hugging Face models: text (and text pairs) through the model's tokenizer, and sentence
pairs for encoder-decoders (source, target shifted right)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from attnaudit.data.batching import IGNORE_INDEX, _pad
from attnaudit.data.types import Batch, Example, text_of
from attnaudit.errors import AttnAuditError, InputError, warn
from attnaudit.models.interface import LanguageModel


class HFCollator:
    """Tokenise examples with the model's tokenizer: text, or (text, query) as a text pair.

    Each example's text as written (:func:`~attnaudit.data.types.text_of`: the file's text, else its words
    joined with spaces; a pair's second text likewise) is tokenised into wordpieces;
    sequences longer than ``max_len`` are truncated with one warning per call.
    ``max_text`` (``--max-length``) keeps at most that many tokens of the text itself
    (:meth:`cut_text`); special tokens, a pair's second text and a prompt's template stay.
    """

    max_text: int | None = None
    warned_cut = False

    def __init__(self, tokenizer: Any, labels: Sequence[str], task_type: str, max_len: int, token_types: bool) -> None:
        if task_type not in ("classification", "pair"):
            raise AttnAuditError(f"Hugging Face encoders here handle classification and pair tasks, not {task_type}")
        self.tokenizer = tokenizer
        self.labels = list(labels)
        self.label_ids = {label: i for i, label in enumerate(self.labels)}
        self.task_type = task_type
        self.max_len = max_len
        self.token_types = token_types

    def texts(self, examples: Sequence[Example]) -> list[str]:
        """The text tokenised for each example: as written (:func:`~attnaudit.data.types.text_of`)."""
        return [text_of(ex) for ex in examples]

    def __call__(self, examples: Sequence[Example]) -> Batch:
        batch = self.tokenise(examples)
        return batch if self.max_text is None else self.cut_text(batch, self.text_tokens(batch))

    def check(self, examples: Sequence[Example]) -> None:
        """One-line errors for no examples or an example without tokens."""
        if not examples:
            raise AttnAuditError("cannot build a batch from no examples")
        for ex in examples:
            if not ex.tokens:
                raise InputError(str(ex.meta.get("source", "<example>")), "example has no tokens")

    def tokenise(self, examples: Sequence[Example]) -> Batch:
        """The padded batch of ``examples`` (before any ``--max-length`` cut)."""
        self.check(examples)
        texts = self.texts(examples)
        pairs = None
        if self.task_type == "pair":
            for ex in examples:
                if not ex.query:
                    raise InputError(str(ex.meta.get("source", "<example>")), "pair example without a query / second sentence")
            pairs = [text_of(ex, query=True) for ex in examples]
        lengths = [len(ids) for ids in self.tokenizer(texts, pairs)["input_ids"]]
        truncated = sum(n > self.max_len for n in lengths)
        if truncated:
            warn(f"{truncated} of {len(examples)} examples are longer than {self.max_len} wordpieces; truncated")
        cut: dict[str, Any] = {"truncation": True, "max_length": self.max_len} if truncated else {}
        enc = self.tokenizer(texts, pairs, padding=True, return_tensors="pt", **cut)
        batch = Batch(tokens=enc["input_ids"], mask=enc["attention_mask"].bool(), examples=list(examples))
        if self.token_types and "token_type_ids" in enc:
            batch.features = enc["token_type_ids"]
        batch.labels = self.label_tensor(examples)
        return batch

    def label_tensor(self, examples: Sequence[Example]) -> Tensor | None:
        """``(B,)`` the examples' label ids; None without a label set (no task: unlabelled)."""
        if not (self.labels and any(ex.label is not None for ex in examples)):
            return None
        ids = []
        for ex in examples:
            if ex.label is None or ex.label not in self.label_ids:
                where = str(ex.meta.get("source", "<example>"))
                raise InputError(where, f"unknown or missing label {ex.label!r}; known: {', '.join(self.labels[:20])}")
            ids.append(self.label_ids[ex.label])
        return torch.tensor(ids, dtype=torch.long)

    def text_tokens(self, batch: Batch) -> Tensor:
        """``(B,T)`` the tokens of the (first) text: real, not special, and in a pair the first segment."""
        special = torch.tensor(sorted(self.tokenizer.all_special_ids), dtype=batch.tokens.dtype)
        text = batch.mask.bool() & ~torch.isin(batch.tokens, special)
        if self.task_type == "pair":
            if batch.features is None:
                raise AttnAuditError("--max-length: this tokenizer marks no segments, so a pair's text cannot be cut apart from its query")
            text &= batch.features == 0
        return text

    def cut_text(self, batch: Batch, text: Tensor) -> Batch:
        """``batch`` with each row's text tokens (``text`` ``(B,T)``) after the first :attr:`max_text` removed
        (later tokens move up, as when the text had ended there); the first cut warns once."""
        assert self.max_text is not None
        drop = text & (text.long().cumsum(1) > self.max_text)
        if not drop.any():
            return batch
        if not self.warned_cut:  # once per collator, not once per batch of a long audit
            warn(f"texts longer than {self.max_text} tokens are truncated (--max-length; {int(drop.any(1).sum())} of the first batch's {len(batch)})")
            self.warned_cut = True
        keep = batch.mask.bool() & ~drop
        width = int(keep.sum(1).max())
        order = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices[:, :width]  # kept positions first, in order
        mask = keep.gather(1, order)

        def take(values: Tensor | None, fill: int | bool) -> Tensor | None:
            return None if values is None else values.gather(1, order).masked_fill(~mask, fill)

        batch.tokens = take(batch.tokens, int(self.tokenizer.pad_token_id or 0))  # type: ignore[assignment]
        batch.features, batch.items = take(batch.features, 0), take(batch.items, False)
        batch.roles = take(batch.roles, -1)
        batch.mask = mask
        return batch


class HFSubwords:
    """One side of a sentence pair through an HF tokenizer, as :class:`~attnaudit.data.word_alignments.SubwordTokenizer`:
    words -> subword ids and the word each belongs to; ids -> words (13a-tokenised, as the gold sentences).

    A fast tokenizer tokenises the sentence and maps tokens to words by character offsets; a slow
    (SentencePiece) one tokenises word by word, which SentencePiece's whitespace split makes the same."""

    def __init__(self, tokenizer: Any, target: bool = False) -> None:
        self.tokenizer = tokenizer
        self.target = target

    def _ids(self, text: str, **kwargs: Any) -> Any:
        return self.tokenizer(text_target=text, **kwargs) if self.target else self.tokenizer(text, **kwargs)

    def encode(self, words: Sequence[str]) -> tuple[list[int], list[int]]:
        """Subword ids of ``words`` (no specials) and, per subword, the index of its word."""
        if not words:
            return [], []
        if not getattr(self.tokenizer, "is_fast", False):
            ids, owners = [], []
            for index, word in enumerate(words):
                pieces = self._ids(word, add_special_tokens=False)["input_ids"]
                ids += pieces
                owners += [index] * len(pieces)
            return ids, owners
        from bisect import bisect_right

        text = " ".join(words)
        starts = [0]
        for word in words[:-1]:
            starts.append(starts[-1] + len(word) + 1)
        encoded = self._ids(text, add_special_tokens=False, return_offsets_mapping=True)
        owners = []
        for start, end in encoded["offset_mapping"]:
            point = end - 1 if end > start else start  # a token belongs to the word of its last character,
            if point < len(text) and text[point] == " ":  # a bare word-start marker to the word after it
                point += 1
            owners.append(min(max(bisect_right(starts, point) - 1, 0), len(words) - 1))
        return list(encoded["input_ids"]), owners

    def specials(self) -> tuple[list[int], list[int]]:
        """The special ids the tokenizer puts before and after a sequence (Marian, T5: ``[]``, ``[</s>]``;
        BART: ``[<s>]``, ``[</s>]``)."""
        plain = self._ids("a", add_special_tokens=False)["input_ids"]
        full = self._ids("a")["input_ids"]
        for start in range(len(full) - len(plain) + 1):
            if full[start : start + len(plain)] == plain:
                return full[:start], full[start + len(plain) :]
        raise AttnAuditError("cannot tell the tokenizer's special tokens apart from the text")

    def words(self, ids: Sequence[int]) -> list[str]:
        """Words of a decoded id sequence (specials dropped), tokenised with sacrebleu's 13a tokenizer."""
        from attnaudit.data.word_alignments import tokenize

        return tokenize(self.tokenizer.decode(list(ids), skip_special_tokens=True))


def forced_batch(
    sources: Sequence[Sequence[int]], prefixes: Sequence[Sequence[int]] | None, start: int, pad_id: int, examples: list[Example]
) -> Batch:
    """Teacher forcing: source rows and, on the decoder, ``start`` followed by each row's target prefix, right-padded.

    The one way a target reaches an encoder-decoder: the alignment test's reference translations (through
    :class:`HFSeq2SeqCollator`, the prefix being the target without its last token) and each step of a
    generated or forced sequence (:func:`attnaudit.explain.generation.forced_row`: the tokens before the step)."""
    tokens, mask = _pad([list(row) for row in sources], pad_id)
    batch = Batch(tokens=tokens, mask=mask, examples=examples)
    if prefixes is not None:
        batch.target, batch.target_mask = _pad([[start, *prefix] for prefix in prefixes], pad_id)
    return batch


class HFSeq2SeqCollator:
    """Batches for an encoder-decoder: ``tokens`` = source with the tokenizer's specials, ``labels`` =
    target with its specials (``-100`` at padding), ``target`` = ``decoder_start + labels[:-1]``.

    ``offsets`` = (source, target) positions of the first subword (the specials before it), which the
    alignment test skips. Sides longer than ``max_len`` are cut, with one warning per batch.
    """

    def __init__(self, tokenizer: Any, max_len: int, decoder_start: int) -> None:
        self.source, self.target = HFSubwords(tokenizer), HFSubwords(tokenizer, target=True)
        self.max_len = max_len
        self.pad_id = int(tokenizer.pad_token_id or 0)
        self.decoder_start = decoder_start
        self._sides = (self.source.specials(), self.target.specials())
        self.offsets = (len(self._sides[0][0]), len(self._sides[1][0]))

    def _wrap(self, ids: list[int], side: int) -> tuple[list[int], bool]:
        before, after = self._sides[side]
        room = self.max_len - len(before) - len(after)
        return before + ids[:room] + after, len(ids) > room

    def __call__(self, examples: Sequence[Example]) -> Batch:
        if not examples:
            raise AttnAuditError("cannot build a batch from no examples")
        with_target = [ex.target is not None for ex in examples]
        if any(with_target) and not all(with_target):
            raise AttnAuditError("a seq2seq batch mixes examples with and without a target")
        sources, labels, truncated = [], [], 0
        for ex in examples:
            if not ex.tokens:
                raise InputError(str(ex.meta.get("source", "<example>")), "example has no source words")
            ids, cut = self._wrap(self.source.encode(ex.tokens)[0], 0)
            sources.append(ids)
            truncated += cut
            if ex.target is not None:
                ids, cut = self._wrap(self.target.encode(ex.target)[0], 1)
                labels.append(ids)
                truncated += cut
        batch = forced_batch(sources, [ids[:-1] for ids in labels] if labels else None, self.decoder_start, self.pad_id, list(examples))
        if labels:
            batch.labels, _ = _pad(labels, IGNORE_INDEX)
        if truncated:
            warn(f"{truncated} sequence(s) in a batch of {len(examples)} exceeded max_len={self.max_len}; truncated")
        return batch


def collator(model: LanguageModel) -> HFSeq2SeqCollator:
    """The batches an encoder-decoder reads: its tokenizer, ``max_len`` and decoder start token."""
    return HFSeq2SeqCollator(model.tokenizer, model.config.max_len, model.decoder_start)
