"""A prompt rendered with the tokenizer's own chat template (one user turn, the assistant's turn opened)."""

from __future__ import annotations

from typing import Any

from attnaudit.errors import AttnAuditError


def has_chat_template(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` carries a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def chat_prompt(tokenizer: Any, user: str) -> str:
    """``user`` as the one user message of the tokenizer's own chat template (``apply_chat_template`` with
    ``add_generation_prompt=True``: what the model reads before its answer); a one-line error without a template."""
    if not has_chat_template(tokenizer):
        raise AttnAuditError("this model's tokenizer has no chat template, so the prompt cannot be rendered as a chat; "
                             "use an instruction-tuned model")
    text = tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True)
    if not isinstance(text, str) or user not in text:
        raise AttnAuditError("the tokenizer's chat template does not show the user's message as written")
    return text
