"""A prompt rendered with the tokenizer's own chat template (one user turn, the assistant's turn opened), through the
one renderer of chat prompts (:func:`attnaudit.models.hf.render_chat`, what ``--chat`` uses everywhere)."""

from __future__ import annotations

from typing import Any

from attnaudit.errors import AttnAuditError
from attnaudit.models.hf import Chat, render_chat


def has_chat_template(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` carries a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def chat_prompt(tokenizer: Any, user: str) -> str:
    """``user`` as the one user message of the tokenizer's own chat template (``apply_chat_template`` with
    ``add_generation_prompt=True``: what the model reads before its answer); a one-line error without a template."""
    if not has_chat_template(tokenizer):
        raise AttnAuditError("this model's tokenizer has no chat template, so the prompt cannot be rendered as a chat; "
                             "use an instruction-tuned model")
    return render_chat(tokenizer, user, Chat()).text
