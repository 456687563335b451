"""What a transformers config says, whatever the family calls it: kind of model, width, heads, limits.

The differences between families here are data: the names under which configs store a value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedModel

WIDTH_NAMES = ("hidden_size", "d_model", "n_embd", "dim")
FFN_NAMES = ("intermediate_size", "ffn_dim", "encoder_ffn_dim", "d_ff", "n_inner", "hidden_dim")
POSITION_NAMES = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")
DROPOUT_NAMES = ("attention_dropout", "attention_probs_dropout_prob", "attn_pdrop", "dropout")
HEAD_NAMES = ("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads")


def model_kind(config: Any) -> str:
    """``encoder-decoder``, ``decoder`` (a causal LM family that is not also a masked LM) or ``encoder``."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder"
    kind = str(getattr(config, "model_type", ""))
    causal = kind in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and kind not in MODEL_FOR_MASKED_LM_MAPPING_NAMES
    return "decoder" if causal or getattr(config, "is_decoder", False) else "encoder"


def first_of(config: Any, names: Sequence[str], default: Any = None) -> Any:
    """The first of ``names`` the config sets (not None), else ``default``."""
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


def output_kind(hf: PreTrainedModel, has_head: bool) -> str:
    """What the model's output is: ``classes`` (a classification head), ``translation``, ``next_token`` (an LM head) or ``states``."""
    if has_head:
        return "classes"
    if getattr(hf.config, "is_encoder_decoder", False):
        return "translation"
    return "next_token" if hf.get_output_embeddings() is not None else "states"


def max_length(hf: PreTrainedModel, tokenizer: Any) -> int:
    """The longest input: the model's position table (less RoBERTa's padding offset) and the tokenizer's limit."""
    positions = first_of(hf.config, POSITION_NAMES)
    embeddings = getattr(hf.base_model, "embeddings", None)
    padding = getattr(embeddings, "padding_idx", None)  # RoBERTa numbers positions from its pad id + 1
    offset = int(padding) + 1 if isinstance(padding, int) else 0
    limits = [int(positions) - offset] if isinstance(positions, int) and positions > 0 else []
    tokenizer_limit = int(getattr(tokenizer, "model_max_length", 0) or 0)
    if 0 < tokenizer_limit < 10**7:
        limits.append(tokenizer_limit)
    return min(limits) if limits else 512


def heads(config: Any) -> int:
    """Attention heads (per query), whatever the config calls them."""
    return int(first_of(config, HEAD_NAMES, 0) or 0)


def decoder_start(hf: PreTrainedModel, pad_id: int) -> int:
    """An encoder-decoder's decoder start token (its config's; else the pad token, as Marian and T5 use)."""
    start = getattr(hf.config, "decoder_start_token_id", None)
    if start is None:
        start = getattr(getattr(hf, "generation_config", None), "decoder_start_token_id", None)
    return int(start) if start is not None else pad_id
