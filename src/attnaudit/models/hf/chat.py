"""Chat templates: a causal LM's prompt rendered by its tokenizer's own chat template (``--chat``).

The user's message is the prompt with the text put in (``{text}``; without a prompt, the text itself),
after an optional system message (``--system``); the template is applied with its generation prompt, so
the rendered prompt ends where the assistant's turn starts and the decision read at its last position is
the assistant's first answer token. The token ids are exactly ``tokenizer.apply_chat_template(messages,
add_generation_prompt=True, tokenize=True)`` (checked on every rendering).

Each position gets a role (:data:`ROLES`): ``system`` (the ``--system`` text), ``user`` (the user's
message: the prompt with the text), ``template`` (what the template adds: role headers, separators, a
default system prompt it inserts) and ``assistant`` (tokens of the assistant's turn: a generated or forced
continuation). The explained items are the user's text by default (the tokens overlapping the ``{text}``
span, as without a chat template), or every position with ``items="all"``.

This is the one place a chat prompt is built: the zero-shot collator (audits, tests, sweeps),
``attnaudit explain`` (one decision, a generated sequence) and the ``generation`` test all call
:func:`render`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from attnaudit.errors import AttnAuditError

ROLES = ("system", "user", "template", "assistant")
"""A position's role; ``Batch.roles`` holds indices into this tuple (-1 at padding)."""
SYSTEM, USER, TEMPLATE, ASSISTANT = range(len(ROLES))
ITEMS = ("user", "all")
"""``--items``: the user's text only (default), or every position (system prompt and template tokens too)."""


@dataclass(frozen=True)
class Chat:
    """How a prompt is rendered as a chat: the ``system`` message (None: none, or the template's own default)
    and which positions are the explained ``items``."""

    system: str | None = None
    items: str = "user"

    def __post_init__(self) -> None:
        if self.items not in ITEMS:
            raise AttnAuditError(f"--items must be one of {', '.join(ITEMS)}, got {self.items!r}")
        if self.system is not None and not self.system.strip():
            raise AttnAuditError("--system is empty; give the system prompt's text (or leave --system out)")

    def to_dict(self) -> dict[str, Any]:
        """What a run's config records (``extra["chat"]``)."""
        return {"system": self.system, "items": self.items}

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> Chat:
        return cls(system=value.get("system"), items=str(value.get("items", "user")))


def check_chat_options(chat: bool | None, system: str | None, items: str | None) -> Chat | None:
    """The :class:`Chat` asked for, or None; ``--system``/``--items`` without ``--chat`` are one-line errors."""
    if not chat:
        given = [flag for flag, value in (("--system", system), ("--items", items)) if value is not None]
        if given:
            raise AttnAuditError(f"{'/'.join(given)} appl{'ies' if len(given) == 1 else 'y'} with --chat only")
        return None
    return Chat(system=system, items=items or "user")


def check_template(tokenizer: Any, source: str) -> None:
    """A one-line error when the tokenizer has no chat template of its own."""
    if not getattr(tokenizer, "chat_template", None):
        raise AttnAuditError(f"--chat: the tokenizer of {source} has no chat template; drop --chat (the text is then read as written)")


def messages(user: str, system: str | None) -> list[dict[str, str]]:
    """The conversation: an optional system message, then the user's message."""
    return ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": user}]


@dataclass
class Rendered:
    """One chat-rendered prompt: its ``text``, token ``ids``, each token's role (index into :data:`ROLES`) and
    whether it is an explained item."""

    text: str
    ids: list[int]
    roles: list[int]
    items: list[bool]


def _ids(encoded: Any) -> list[int]:
    """Token ids from ``apply_chat_template(tokenize=True)``: a list, or a mapping holding ``input_ids``."""
    if hasattr(encoded, "keys"):
        encoded = encoded["input_ids"]
    return [int(i) for i in encoded]


def render(tokenizer: Any, text: str, chat: Chat, prompt: str = "{text}") -> Rendered:
    """``text`` put into ``prompt`` and rendered as the user's message by the tokenizer's own chat template."""
    user = prompt.replace("{text}", text)
    conversation = messages(user, chat.system)
    rendered = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    without = tokenizer.apply_chat_template(conversation, add_generation_prompt=False, tokenize=False)
    end = len(without) if rendered.startswith(without) else len(rendered)  # the generation prompt starts there
    start = rendered.rfind(user, 0, end)
    if start < 0:
        raise AttnAuditError("--chat: the chat template changes the user's message (its text is not in the rendered prompt)")
    spans = [(start, start + len(user), USER)]
    if chat.system is not None:
        at = rendered.rfind(chat.system, 0, start)
        if at < 0:
            raise AttnAuditError("--chat: the chat template changes the --system text (it is not in the rendered prompt)")
        spans.append((at, at + len(chat.system), SYSTEM))
    offset = start + prompt.index("{text}")
    ids, offsets = _tokens(tokenizer, rendered)
    expected = _ids(tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True))
    if ids != expected:
        raise AttnAuditError("--chat: the rendered prompt does not tokenize to the chat template's own token ids")
    roles = [next((role for a, b, role in spans if lo < b and hi > a), TEMPLATE) for lo, hi in offsets]
    items = [hi > lo and lo < offset + len(text) and hi > offset for lo, hi in offsets]
    if chat.items == "all":
        items = [True] * len(ids)
    return Rendered(text=rendered, ids=ids, roles=roles, items=items)


def _tokens(tokenizer: Any, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids of ``text`` (no special tokens added: the template writes its own) and each token's character span.

    A slow tokenizer has no offsets: each token's span is then found by decoding the ids before it."""
    if getattr(tokenizer, "is_fast", False):
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(encoded["input_ids"]), [(int(a), int(b)) for a, b in encoded["offset_mapping"]]
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    ends = [len(tokenizer.decode(ids[: i + 1])) for i in range(len(ids))]
    return ids, list(zip([0, *ends[:-1]], ends))


def role_names(roles: Sequence[int]) -> list[str]:
    """Role indices as names (-1, padding: ``""``)."""
    return [ROLES[r] if r >= 0 else "" for r in roles]


def padded(rows: Sequence[Sequence[int]], fill: int) -> torch.Tensor:
    """``(B, T)`` long rows right-padded with ``fill``."""
    width = max(len(row) for row in rows)
    return torch.tensor([list(row) + [fill] * (width - len(row)) for row in rows], dtype=torch.long)
