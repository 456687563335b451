"""Hugging Face encoder-decoders built from scratch for ``attnaudit train-nmt --arch marian|bart``: a
randomly initialised Marian or BART model and a transformers tokenizer around attnaudit's joint subword
vocabulary, wrapped like any loaded model (:class:`~attnaudit.models.hf.model.HFModel`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attnaudit.errors import AttnAuditError
from attnaudit.models.hf.model import HFModel

if TYPE_CHECKING:
    from transformers import PreTrainedModel

ARCHITECTURES = ("marian", "bart")
"""Encoder-decoder configurations ``train-nmt --arch`` builds from scratch (beside our own ``nmt``)."""


def fresh_tokenizer(subwords: Any) -> Any:
    """A transformers tokenizer around a joint :class:`~attnaudit.data.word_alignments.SubwordTokenizer`
    (``<pad>`` 0, ``<unk>`` 1, ``<s>`` 2, ``</s>`` 3): ``</s>`` appended, ``##`` pieces joined when decoding."""
    import copy

    from tokenizers import decoders, processors
    from transformers import PreTrainedTokenizerFast

    from attnaudit.data.word_alignments import CONTINUATION, EOS, EOS_ID

    core = copy.deepcopy(subwords.tokenizer)
    core.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, EOS_ID)])
    core.decoder = decoders.WordPiece(prefix=CONTINUATION)
    # No model_max_length: sentences are measured before they are cut (fits_length), and the model's
    # own limit (max_position_embeddings) caps batches.
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token=EOS)


def fresh_seq2seq(arch: str, tokenizer: Any, layers: int, heads: int, d_model: int, d_ff: int, dropout: float, max_len: int) -> HFModel:
    """A randomly initialised Marian or BART model of the given size over ``tokenizer``'s joint vocabulary
    (embeddings shared by encoder, decoder and LM head; the decoder starts from ``<pad>`` as Marian's do)."""
    from transformers import (
        BartConfig,
        BartForConditionalGeneration,
        MarianConfig,
        MarianMTModel,
    )

    if arch not in ARCHITECTURES:
        raise AttnAuditError(f"unknown encoder-decoder architecture {arch!r}; choose one of {', '.join(ARCHITECTURES)}")
    size = {
        "vocab_size": len(tokenizer), "d_model": d_model, "encoder_layers": layers, "decoder_layers": layers,
        "encoder_attention_heads": heads, "decoder_attention_heads": heads, "encoder_ffn_dim": d_ff, "decoder_ffn_dim": d_ff,
        "dropout": dropout, "attention_dropout": 0.0, "activation_dropout": 0.0, "activation_function": "relu",
        "max_position_embeddings": max_len, "pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": tokenizer.bos_token_id, "decoder_start_token_id": tokenizer.pad_token_id,
        "forced_eos_token_id": tokenizer.eos_token_id, "scale_embedding": True, "tie_word_embeddings": True,
    }
    if arch == "marian":
        hf: PreTrainedModel = MarianMTModel(MarianConfig(decoder_vocab_size=len(tokenizer), **size))
    else:
        hf = BartForConditionalGeneration(BartConfig(**size))
    hf.config.architectures = [type(hf).__name__]
    return HFModel(hf.eval(), tokenizer, "seq2seq", f"fresh {arch}", trained_head=True)
