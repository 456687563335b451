"""Zero-shot classification with a decoder-only causal LM: a prompt template and a verbalizer.

Each example's text is put into the template (``"Review: {text}\\nSentiment:"``); the model's
next-token logits at the last prompt position are read at the first token of each label's
verbalizer string (``" positive"``), in the task's label order. Those ``(B, labels)`` logits are
the model's output, so the prediction is their softmax and the tests that need a prediction run.
The explanation query is the last prompt position (:meth:`~attnaudit.models.interface.AttentionModel.explanation_rows`).

The ranked items are the input text's tokens only, the ``{text}`` span of the filled prompt:
:class:`ZeroShotCollator` sets ``Batch.items`` to the tokens whose characters overlap that span
(tokenizer offsets; a token straddling the border, such as ``" The"`` after ``"Review:"``,
counts as text), so every explanation and test ranks text tokens only, with 0 on the template.
The template tokens still take part in the forward pass and receive attention; the norm
analysis reports their share (and the first token's, the attention sink) apart.

:func:`next_token_decision` is the same mechanism without a verbalizer: the classes are the whole
vocabulary, so the decision is the predicted next token (``attnaudit explain`` on a causal LM).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from attnaudit.data.types import Batch, Example
from attnaudit.errors import AttnAuditError
from attnaudit.models.hf.batches import HFCollator
from attnaudit.models.hf.chat import Chat, padded, render
from attnaudit.models.interface import LanguageModel

SENTIMENT_PROMPT = "Review: {text}\nSentiment:"
SENTIMENT_VERBALIZER = {"negative": " negative", "positive": " positive"}
DEFAULTS: dict[str, tuple[str, dict[str, str]]] = {
    "sst": (SENTIMENT_PROMPT, SENTIMENT_VERBALIZER),
    "sst2": (SENTIMENT_PROMPT, SENTIMENT_VERBALIZER),
    "synthetic": (SENTIMENT_PROMPT, SENTIMENT_VERBALIZER),
}
"""Prompt and verbalizer used when ``--hf`` names a causal LM and the task is one of these."""
CHAT_SENTIMENT_PROMPT = "Is the sentiment of this movie review positive or negative? Answer with one word.\n\nReview: {text}"
CHAT_SENTIMENT_VERBALIZER = {"negative": "Negative", "positive": "Positive"}
CHAT_DEFAULTS: dict[str, tuple[str, dict[str, str]]] = {task: (CHAT_SENTIMENT_PROMPT, CHAT_SENTIMENT_VERBALIZER) for task in DEFAULTS}
"""The same with ``--chat``: a question the user asks, answered by the assistant's first token, which follows the
template's assistant header and so has no leading space (capitalised, as an answer starts)."""
ITEMS_NOTE = "ranked items are the input text's tokens only (the {text} span of the prompt); template tokens are not ranked"
CHAT_ITEMS_NOTE = {
    "user": "the prompt is the user's message in the tokenizer's chat template; ranked items are the user's text (the {text} span) only",
    "all": "the prompt is the user's message in the tokenizer's chat template; every position is ranked (system, user, template)",
}

_PAIR = re.compile(r'\s*([^=,]+?)\s*=(?:\s*"([^"]*)"\s*|([^,]*))(?:,|$)')


def parse_verbalizer(text: str) -> dict[str, str]:
    """``positive=" positive",negative=" negative"`` -> ``{"positive": " positive", ...}``.

    Quotes are optional (a shell removes them): an unquoted word keeps its spaces up to the comma."""
    pairs: dict[str, str] = {}
    position = 0
    while position < len(text):
        match = _PAIR.match(text, position)
        if match is None or match.end() == position:
            raise AttnAuditError(f"--verbalizer: cannot read {text[position:]!r}; expected LABEL=\"WORD\",LABEL=\"WORD\"")
        label, word = match.group(1), match.group(2) if match.group(2) is not None else match.group(3)
        if label in pairs:
            raise AttnAuditError(f"--verbalizer: label {label!r} given twice")
        pairs[label] = word
        position = match.end()
    if len(pairs) < 2:
        raise AttnAuditError("--verbalizer needs at least two labels, e.g. positive=\" positive\",negative=\" negative\"")
    return pairs


def fill(prompt: str, text: str) -> str:
    """The prompt with ``{text}`` replaced (no other braces are interpreted)."""
    return prompt.replace("{text}", text)


class ZeroShotCollator(HFCollator):
    """:class:`HFCollator` whose texts are the examples' texts put into the prompt template; with ``chat``,
    the filled prompt is the user's message rendered by the tokenizer's chat template (:func:`attnaudit.models.hf.chat.render`:
    ``Batch.roles`` marks each position's role, ``Batch.items`` the user's text or every position)."""

    def __init__(self, prompt: str, tokenizer: Any, labels: Sequence[str], max_len: int, chat: Chat | None = None) -> None:
        super().__init__(tokenizer, labels, "classification", max_len, token_types=False)
        self.prompt = prompt
        self.chat = chat

    def texts(self, examples: Sequence[Example]) -> list[str]:
        return [fill(self.prompt, text) for text in super().texts(examples)]

    def tokenise(self, examples: Sequence[Example]) -> Batch:
        if self.chat is not None:
            return self.chat_batch(examples)
        batch = super().tokenise(examples)
        spans = [text_span(self.prompt, text) for text in super().texts(examples)]
        batch.items = text_items(self.tokenizer, self.texts(examples), spans, batch.mask.shape[1], self.max_len) & batch.mask
        return batch

    def chat_batch(self, examples: Sequence[Example]) -> Batch:
        """The examples' chat-rendered prompts, right-padded, with their roles and items."""
        assert self.chat is not None
        self.check(examples)
        rows = [render(self.tokenizer, text, self.chat, self.prompt) for text in super().texts(examples)]
        longest = max(len(row.ids) for row in rows)
        if longest > self.max_len:
            raise AttnAuditError(f"--chat: a rendered prompt has {longest} tokens; this model reads at most {self.max_len} (use --max-length)")
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        tokens = padded([row.ids for row in rows], int(pad or 0))
        mask = padded([[1] * len(row.ids) for row in rows], 0).bool()
        batch = Batch(tokens=tokens, mask=mask, examples=list(examples), labels=self.label_tensor(examples))
        batch.roles = padded([row.roles for row in rows], -1)
        batch.items = padded([[int(i) for i in row.items] for row in rows], 0).bool()
        return batch

    def text_tokens(self, batch: Batch) -> Tensor:
        """The text span's tokens: ``--max-length`` cuts the text and keeps the template."""
        if self.chat is not None and batch.roles is not None:  # with --items all, still the user's text only
            return self.user_text(batch)
        assert batch.items is not None
        return batch.items

    def user_text(self, batch: Batch) -> Tensor:
        """``(B, T)`` the user's text tokens of chat-rendered rows (re-rendered with the default items)."""
        assert self.chat is not None
        chat = Chat(system=self.chat.system)
        rows = [render(self.tokenizer, text, chat, self.prompt).items for text in super().texts(batch.examples)]
        return padded([[int(i) for i in row] for row in rows], 0).bool()[:, : batch.tokens.shape[1]]


def text_span(prompt: str, text: str) -> tuple[int, int]:
    """Character span ``[start, end)`` of ``text`` in ``fill(prompt, text)``."""
    start = prompt.index("{text}")
    return start, start + len(text)


def text_items(tokenizer: Any, filled: Sequence[str], spans: Sequence[tuple[int, int]], width: int, max_len: int) -> Tensor:
    """``(B, width)`` bool: the tokens of each filled prompt whose characters overlap its text span.

    A fast tokenizer gives each token's character offsets; a slow one is handled by counting the
    tokens of the prompt up to the span's start and end (exact when no token crosses a border)."""
    items = torch.zeros(len(filled), width, dtype=torch.bool)
    if getattr(tokenizer, "is_fast", False):
        offsets = tokenizer(list(filled), return_offsets_mapping=True, truncation=True, max_length=max_len)["offset_mapping"]
        for row, (pairs, (start, end)) in enumerate(zip(offsets, spans)):
            for column, (a, b) in enumerate(pairs[:width]):
                items[row, column] = b > a and a < end and b > start
        return items
    for row, (text, (start, end)) in enumerate(zip(filled, spans)):
        count = [len(tokenizer(part)["input_ids"]) for part in (text[:start], text[:end])]
        items[row, min(count[0], width) : min(count[1], width)] = True
    return items


def verbalizer_ids(tokenizer: Any, verbalizer: dict[str, str], labels: Sequence[str]) -> list[int]:
    """The first token id of each label's verbalizer string, in ``labels`` order; two labels may not share one."""
    missing = [label for label in labels if label not in verbalizer]
    extra = [label for label in verbalizer if label not in labels]
    if missing or extra:
        raise AttnAuditError(
            f"--verbalizer labels {', '.join(verbalizer)} do not match the task's labels {', '.join(labels)}"
        )
    ids: dict[int, str] = {}
    for label in labels:
        tokens = tokenizer(verbalizer[label], add_special_tokens=False)["input_ids"]
        if not tokens:
            raise AttnAuditError(f"--verbalizer: {verbalizer[label]!r} (label {label!r}) has no tokens")
        if tokens[0] in ids:
            shared = tokenizer.convert_ids_to_tokens(tokens[0])
            raise AttnAuditError(
                f"--verbalizer: labels {ids[tokens[0]]!r} and {label!r} share their first token {shared!r}; "
                "choose words that start differently"
            )
        ids[tokens[0]] = label
    return list(ids)


def resolve(
    task: str | None, prompt: str | None, verbalizer: str | dict[str, str] | None, chat: bool = False
) -> tuple[str, dict[str, str]] | None:
    """The ``(prompt, verbalizer)`` to use: given ones, else the task's defaults (``chat``: those for a chat
    template, :data:`CHAT_DEFAULTS`); None when neither applies.

    A literal ``\\n`` in ``prompt`` (as typed in a shell) is a newline."""
    if prompt is not None:
        prompt = prompt.replace("\\n", "\n")
    default = (CHAT_DEFAULTS if chat else DEFAULTS).get((task or "").lower())
    if isinstance(verbalizer, str):
        verbalizer = parse_verbalizer(verbalizer)
    if prompt is None and verbalizer is None:
        return default
    prompt = prompt if prompt is not None else default[0] if default else None
    verbalizer = verbalizer if verbalizer is not None else default[1] if default else None
    if prompt is None or verbalizer is None:
        missing = "--prompt" if prompt is None else "--verbalizer"
        raise AttnAuditError(f"zero-shot classification needs {missing} too (task {task!r} has no default)")
    if prompt.count("{text}") != 1:
        raise AttnAuditError(f"--prompt must contain {{text}} exactly once: {prompt!r}")
    return prompt, verbalizer


DERIVED_PROMPT = "Text: {text}\nQuestion: {choices}?\nAnswer:"
"""The prompt made from a task's label names when it has no default and none is given (``{choices}``: the names)."""


def derive(labels: Sequence[str], tokenizer: Any, chat: bool = False) -> tuple[str, dict[str, str]]:
    """A prompt and verbalizer from the task's label names, so that an LLM classifies any labelled data zero-shot:
    the names offered as the answer, each verbalized by itself after a space (then capitalized, where the first
    tokens clash); a one-line error when no spelling gives every label its own first token. With ``chat`` the
    answer opens the assistant's turn, so the names are verbalized without the space."""
    if len(labels) < 2:
        raise AttnAuditError("zero-shot classification needs at least two labels")
    choices = ", ".join(f'"{label}"' for label in labels[:-1]) + f' or "{labels[-1]}"'
    prompt = DERIVED_PROMPT.replace("{choices}", choices)
    for spell in (str, str.capitalize, str.upper):
        verbalizer = {label: ("" if chat else " ") + spell(str(label)) for label in labels}
        with contextlib.suppress(AttnAuditError):
            verbalizer_ids(tokenizer, verbalizer, labels)
            return prompt, verbalizer
    raise AttnAuditError(
        f"the label names {', '.join(labels)} do not start with distinct tokens for this tokenizer; "
        'give --verbalizer LABEL="WORD",... (and --prompt) yourself'
    )


def make_zero_shot(model: LanguageModel, prompt: str, verbalizer: dict[str, str], labels: Sequence[str], derived: bool = False) -> None:
    """Turn a causal LM into a zero-shot classifier over ``labels`` (its outputs become the verbalizer logits);
    ``derived``: the prompt and verbalizer were made from the label names (:func:`derive`), which the notes say."""
    if model.config.extra.get("output") != "next_token":
        raise AttnAuditError("--prompt/--verbalizer need a causal language model without a classification head")
    ids = verbalizer_ids(model.tokenizer, verbalizer, labels)
    model.verbalizer_ids = torch.tensor(ids, dtype=torch.long)
    model.trained_head = True
    model.config.num_labels = len(ids)
    chat = model.config.extra.get("chat")
    note = ITEMS_NOTE if not chat else CHAT_ITEMS_NOTE[str(chat.get("items", "user"))]
    model.config.extra.update(
        trained_head=True, output="verbalizer",
        zero_shot={"prompt": prompt, "verbalizer": {label: verbalizer[label] for label in labels}, "token_ids": ids,
                   "items": note + (
                       "; prompt and verbalizer derived from the label names (--prompt/--verbalizer override them)" if derived else ""
                   )},
    )
