"""The tokens a baseline puts in place of an item: ``unk``, ``pad``, ``mask`` or ``eos`` (Integrated Gradients' baseline
embeddings, leave-one-out's and the erasures' replacements). One meaning per name: ``mask`` is the tokenizer's mask
token wherever it is used; ``zero`` (IG only) is no token and ``delete`` (perturbations only) removes the item."""

from __future__ import annotations

from typing import Any

from attnaudit.data.vocab import Vocab
from attnaudit.errors import AttnAuditError
from attnaudit.explain.registry import BASELINES
from attnaudit.models.interface import AttentionModel

TOKENS = ("unk", "pad", "mask", "eos")
"""The baselines that are a token of the vocabulary."""


def _has_token(tokenizer: Any, name: str) -> bool:
    """Whether a tokenizer (None: our vocabularies, with pad and unk only) has an ``unk``/``pad``/``mask``/``eos`` token."""
    if tokenizer is None:
        return name in ("pad", "unk")
    return getattr(tokenizer, f"{name}_token_id", None) is not None


def baseline_token(model: AttentionModel, name: str, who: str = "ig", other: str = "zero") -> int:
    """The id of the ``unk``/``pad``/``mask``/``eos`` token: a Hugging Face model's tokenizer's, else our
    vocabularies' (``<pad>`` 0, ``<unk>`` 1; they have no mask or end token); a one-line error when there is none."""
    tokenizer = model.tokenizer
    if tokenizer is not None:
        found = getattr(tokenizer, f"{name}_token_id", None)
    else:
        found = {"pad": Vocab.pad_id, "unk": Vocab.unk_id}.get(name)
    if found is None:
        # Suggest only the tokens this model has (``mask`` was once offered to a model without one).
        offered = [other, *(token for token in BASELINES if token in TOKENS and token != name and _has_token(tokenizer, token))]
        choices = f"{', '.join(offered[:-1])} or {offered[-1]}" if len(offered) > 1 else other
        raise AttnAuditError(f"{who} baseline {name!r}: this model's {'tokenizer' if tokenizer is not None else 'vocabulary'} has no {name} token; "
                             f"choose {choices}")
    if not 0 <= int(found) < model.config.vocab_size:
        raise AttnAuditError(f"{who} baseline {name!r}: token id {found} is outside the model's {model.config.vocab_size} embeddings")
    return int(found)
