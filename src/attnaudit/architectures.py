"""Tiny randomly initialised Hugging Face models of 48 architectures, built offline in about a second.

Why: the audits read attention out of each family's own model code (grouped- and multi-query
heads, mixtures of experts, sliding windows, relative positions, cross-attention); a tiny model
of each family exercises that code in tests without a download. Every model is 32 wide with 3
layers (so that layer 1 is a middle layer) and 4 attention heads, uses one word-level tokenizer
per kind (about 60 words for sentiment sentences and short prompts) and eager attention, the
implementation that returns attention weights.

The sizes are data (:data:`SIZES`, in each config's own field names), not branches.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import transformers
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from torch import Tensor
from transformers import (
    CONFIG_MAPPING,
    AutoConfig,
    PreTrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

from attnaudit.errors import AttnAuditError

_DECODERS = (
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text",
    "phi", "phi3", "gpt2", "gpt_neox", "gptj", "opt", "falcon", "bloom", "olmo", "olmo2", "stablelm",
    "starcoder2", "granite", "cohere", "smollm3", "gpt_bigcode", "codegen", "helium", "glm",
)
_ENCODERS = (
    "bert", "roberta", "distilbert", "albert", "electra", "deberta", "deberta-v2", "xlm-roberta", "modernbert",
    "mpnet", "camembert",
)
_ENCODER_DECODERS = ("t5", "mt5", "bart", "mbart", "marian", "pegasus", "m2m_100", "blenderbot")

ARCHITECTURES: dict[str, str] = {
    **dict.fromkeys(_DECODERS, "decoder"),
    **dict.fromkeys(_ENCODERS, "encoder"),
    **dict.fromkeys(_ENCODER_DECODERS, "encoder-decoder"),
}
"""``model_type`` (as ``AutoConfig`` spells it) -> kind: "decoder", "encoder" or "encoder-decoder"."""

HEADS: dict[str, tuple[str, ...]] = {
    "decoder": ("lm", "classifier", "bare"),
    "encoder": ("classifier", "bare"),
    "encoder-decoder": ("lm", "bare"),
}
"""Each kind's heads (a model type's own: :func:`heads_of`); the first is :func:`save_tiny`'s default."""

_NO_CLASSIFIER = frozenset({"codegen", "cohere", "granite"})
"""Decoders that transformers 5.23 has no ``ForSequenceClassification`` class for."""

_AUTO_CLASSES = {
    ("decoder", "lm"): "AutoModelForCausalLM",
    ("encoder-decoder", "lm"): "AutoModelForSeq2SeqLM",
    ("decoder", "classifier"): "AutoModelForSequenceClassification",
    ("encoder", "classifier"): "AutoModelForSequenceClassification",
}
"""The Auto class of each (kind, head); every kind's "bare" head is ``AutoModel``."""

MAX_LENGTH = 64
"""Tokens per sequence: the tokenizers' ``model_max_length`` and the models' position tables."""

WINDOW = 4
"""The sliding-window models' window, shorter than a sentence so that it masks something."""

# Field sets shared by families. Wherever a config has num_key_value_heads, 2 of the 4 heads (GQA).
_LLAMA = {
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": MAX_LENGTH,
}
_HEAD_DIM = {**_LLAMA, "head_dim": 8}  # configs whose head_dim defaults to a full-size 128 or 256
_BERT = {
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
    "max_position_embeddings": MAX_LENGTH,
}
_ROBERTA = {**_BERT, "max_position_embeddings": MAX_LENGTH + 2}  # positions are numbered from pad id + 1
_GPT = {"n_embd": 32, "n_layer": 3, "n_head": 4, "n_positions": MAX_LENGTH}
_BART = {
    "d_model": 32, "encoder_layers": 3, "decoder_layers": 3, "encoder_attention_heads": 4,
    "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "max_position_embeddings": MAX_LENGTH,
}
_T5 = {"d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 3, "num_decoder_layers": 3, "num_heads": 4}
_MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
_GEMMA = {**_HEAD_DIM, "query_pre_attn_scalar": 8, "sliding_window": WINDOW}
# Disentangled attention (content-to-position and back), as in the released checkpoints.
_DEBERTA = {**_BERT, "relative_attention": True, "pos_att_type": ["c2p", "p2c"], "position_biased_input": False}

SIZES: dict[str, dict[str, Any]] = {
    "llama": _HEAD_DIM,
    "mistral": {**_HEAD_DIM, "sliding_window": WINDOW},
    "mixtral": {**_HEAD_DIM, "num_local_experts": 4, "num_experts_per_tok": 2},
    # Layer 0 full attention, layers 1 and 2 sliding.
    "qwen2": {**_LLAMA, "use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1},
    "qwen2_moe": {**_LLAMA, **_MOE, "shared_expert_intermediate_size": 64},
    "qwen3": _HEAD_DIM,
    "qwen3_moe": {**_HEAD_DIM, **_MOE},
    "gemma": _HEAD_DIM,
    "gemma2": _GEMMA,  # layer types alternate by default: sliding, full, sliding
    "gemma3_text": {**_GEMMA, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]},
    "phi": _LLAMA,
    "phi3": _LLAMA,
    "gpt2": _GPT,
    "gpt_neox": _BERT,
    "gptj": {**_GPT, "rotary_dim": 4},  # the default 64 exceeds the heads' 8 dimensions
    "opt": {**_BERT, "ffn_dim": 64, "word_embed_proj_dim": 32},
    "falcon": {**_BERT, "ffn_hidden_size": 64, "new_decoder_architecture": True, "num_kv_heads": 2},
    "bloom": {"hidden_size": 32, "n_layer": 3, "n_head": 4},  # ALiBi: no position table
    "olmo": _LLAMA,
    "olmo2": _LLAMA,
    "stablelm": _LLAMA,
    "starcoder2": {**_LLAMA, "sliding_window": WINDOW},
    "granite": _LLAMA,
    "cohere": _LLAMA,
    "smollm3": _LLAMA,
    "gpt_bigcode": {**_GPT, "multi_query": True},  # one key/value head
    "codegen": {**_GPT, "n_ctx": MAX_LENGTH, "rotary_dim": 4},
    "helium": _HEAD_DIM,
    "glm": _HEAD_DIM,
    "bert": _BERT,
    "roberta": _ROBERTA,
    "distilbert": {"dim": 32, "hidden_dim": 64, "n_layers": 3, "n_heads": 4, "max_position_embeddings": MAX_LENGTH},
    "albert": {**_BERT, "embedding_size": 16},
    "electra": {**_BERT, "embedding_size": 16},
    "deberta": _DEBERTA,
    "deberta-v2": {**_DEBERTA, "position_buckets": 16, "share_att_key": True, "norm_rel_ebd": "layer_norm"},  # v3's
    "xlm-roberta": _ROBERTA,
    "modernbert": {**_BERT, "local_attention": WINDOW},  # layer 0 global, layers 1-2 local
    "mpnet": _BERT,
    "camembert": _ROBERTA,
    "t5": _T5,
    "mt5": _T5,
    "bart": _BART,
    "mbart": _BART,
    "marian": _BART,
    "pegasus": _BART,
    "m2m_100": _BART,
    "blenderbot": _BART,
}
"""Per-architecture ``AutoConfig.for_model`` arguments; the vocabulary and special ids come from the tokenizer."""

_DECODER_START = {"bart": "</s>", "mbart": "</s>", "m2m_100": "</s>", "blenderbot": "<s>"}
"""The token an encoder-decoder's decoder starts from, as in the released checkpoints; the others' is <pad>."""

WORDS: tuple[str, ...] = (
    "the", "a", "an", "this", "that", "it", "i", "you", "we", "they",
    "film", "movie", "story", "plot", "acting", "ending", "music",
    "was", "is", "were", "are", "be", "been", "not", "no", "never", "very", "really", "quite", "so", "too",
    "good", "great", "excellent", "wonderful", "fun", "bad", "awful", "terrible", "boring", "dull",
    "liked", "loved", "hated", "enjoyed",
    "and", "but", "or", "of", "to", "in", "with", "for", "review", "sentiment", "positive", "negative",
    ".", ",", "!", "?", ":",
)
"""The tokenizers' words (after the special tokens): enough for sentiment sentences and short prompts."""

_SPECIALS = {
    "encoder": {
        "pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]", "mask_token": "[MASK]",
    },
    "decoder": {"pad_token": "<pad>", "unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"},
    "encoder-decoder": {"pad_token": "<pad>", "unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"},
}
"""Each kind's special tokens (ids 0, 1, ... in this order), named as BERT, Llama and T5/BART name theirs."""

_TEMPLATES = {
    "encoder": ("[CLS] $A [SEP]", "[CLS] $A [SEP] $B:1 [SEP]:1"),
    "decoder": ("<s> $A", "<s> $A <s>:1 $B:1"),
    "encoder-decoder": ("$A </s>", "$A </s> $B:1 </s>:1"),
}
"""Each kind's special tokens around one text and around a pair (BERT, Llama and T5 style)."""


def list_architectures(kind: str | None = None) -> list[str]:
    """The catalogue's model types, all or those of one ``kind``, in catalogue order."""
    if kind is not None:
        _check_kind(kind)
    return [name for name, of_kind in ARCHITECTURES.items() if kind in (None, of_kind)]


def heads_of(model_type: str) -> tuple[str, ...]:
    """The heads :func:`build_tiny` builds for ``model_type``: its kind's, less those transformers lacks."""
    kind = _kind(model_type)
    return tuple(head for head in HEADS[kind] if not (head == "classifier" and model_type in _NO_CLASSIFIER))


def tiny_tokenizer(kind: str) -> PreTrainedTokenizerFast:
    """A lower-casing word-level tokenizer over :data:`WORDS` with the special tokens of ``kind``.

    Encoders: ``[PAD] [UNK] [CLS] [SEP] [MASK]``, adding ``[CLS] A [SEP]`` (pairs
    ``[CLS] A [SEP] B [SEP]``); decoders: ``<pad> <unk> <s> </s>``, prepending ``<s>``;
    encoder-decoders: the same tokens, appending ``</s>``. Padding is on the right.
    """
    _check_kind(kind)
    specials = _SPECIALS[kind]
    ids = {token: index for index, token in enumerate([*specials.values(), *WORDS])}
    core = Tokenizer(models.WordLevel(ids, unk_token=specials["unk_token"]))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    single, pair = _TEMPLATES[kind]
    core.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[(token, ids[token]) for token in specials.values()]
    )
    return PreTrainedTokenizerFast(tokenizer_object=core, model_max_length=MAX_LENGTH, padding_side="right", **specials)


def tiny_config(model_type: str, tokenizer: PreTrainedTokenizerFast) -> PreTrainedConfig:
    """The config of a tiny ``model_type``: :data:`SIZES`, the tokenizer's vocabulary and special ids, 2 labels.

    The labels are a classifier head's (the other heads ignore them).
    """
    kind = _kind(model_type)
    if kind == "encoder":
        start, end = tokenizer.cls_token_id, tokenizer.sep_token_id
    else:
        start, end = tokenizer.bos_token_id, tokenizer.eos_token_id
    ids = {"pad_token_id": tokenizer.pad_token_id, "bos_token_id": start, "eos_token_id": end}
    if kind == "encoder-decoder":
        ids["decoder_start_token_id"] = tokenizer.convert_tokens_to_ids(_DECODER_START.get(model_type, "<pad>"))
    # Ids some configs carry besides (ModernBERT's [CLS]/[SEP], the BART family's forced end): the tokenizer's too.
    more = (("cls_token_id", start), ("sep_token_id", end), ("forced_eos_token_id", end))
    ids.update((name, value) for name, value in more if getattr(CONFIG_MAPPING[model_type], name, None) is not None)
    return AutoConfig.for_model(model_type, vocab_size=len(tokenizer), num_labels=2, **SIZES[model_type], **ids)


def build_tiny(model_type: str, head: str, seed: int = 0) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A tiny random ``model_type`` with ``head``, in eval mode, and its tokenizer.

    ``head``: "lm" (a decoder's causal LM, an encoder-decoder's sequence-to-sequence LM),
    "classifier" (a two-label sequence classifier: encoders and most decoders, see
    :func:`heads_of`) or "bare" (no head). The weights depend on ``seed`` only; attention is eager.
    """
    kind, heads = _kind(model_type), heads_of(model_type)
    if head not in heads:
        raise AttnAuditError(f"tiny {model_type} models have the heads {', '.join(heads)}, not {head!r}")
    tokenizer = tiny_tokenizer(kind)
    config = tiny_config(model_type, tokenizer)
    auto_class = getattr(transformers, _AUTO_CLASSES.get((kind, head), "AutoModel"))
    torch.manual_seed(seed)
    model = auto_class.from_config(config, attn_implementation="eager")
    return model.eval(), tokenizer


def save_tiny(model_type: str, folder: str | Path, head: str | None = None, seed: int = 0) -> Path:
    """Save :func:`build_tiny`'s model (safetensors) and tokenizer into ``folder``; return the folder.

    ``head`` None: the usual one of the kind ("lm" for decoders and encoder-decoders, "classifier"
    for encoders). Note: transformers' ``AutoTokenizer`` loads a saved qwen2 tokenizer as its
    byte-level ``Qwen2Tokenizer``, which does not keep this word-level one; load it with
    ``PreTrainedTokenizerFast.from_pretrained``.
    """
    from transformers.utils import logging as hf_logging

    model, tokenizer = build_tiny(model_type, head or heads_of(model_type)[0], seed)
    folder = Path(folder)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # transformers draws a bar per saved shard
    try:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return folder


def _check_kind(kind: str) -> None:
    """Refuse a kind outside :data:`HEADS`."""
    if kind not in HEADS:
        raise AttnAuditError(f"unknown kind {kind!r}: expected one of {', '.join(HEADS)}")


def _kind(model_type: str) -> str:
    """The kind of a catalogued ``model_type``; an error naming the catalogue otherwise."""
    if model_type not in ARCHITECTURES:
        raise AttnAuditError(f"no tiny model of {model_type!r}: the catalogue has {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[model_type]


# -- the architecture matrix: each family checked against its own eager forward ---------------------------

SENTENCES = ("the film was very good", "it was a boring movie and i hated it", "great acting !", "the plot was dull")
TARGETS = ("a good film", "a bad movie", "great !", "dull")
TOLERANCE = 1e-5
PROMPT = "review : {text} sentiment :"
VERBALIZER = 'pos=" positive",neg=" negative"'
REVIEWS = (
    ("the film was very good", "pos"), ("great acting !", "pos"), ("i loved this movie", "pos"), ("a wonderful story", "pos"),
    ("the plot was dull", "neg"), ("a boring movie", "neg"), ("i hated it", "neg"), ("the acting was awful", "neg"),
)
CHECKS = ("weights", "logits", "intervention", "restart")
"""The figures of :func:`check` that must stay within :data:`TOLERANCE` (and ``generation``, where a model generates)."""


def write_reviews(folder: Path) -> Path:
    """A small labelled CSV over the tiny tokenizers' words (both labels, shuffled, repeated to 24 rows)."""
    path = folder / "reviews.csv"
    rows = [REVIEWS[i] for i in (0, 4, 1, 5, 2, 6, 3, 7)] * 3
    path.write_text("text,label\n" + "".join(f"{text},{label}\n" for text, label in rows), encoding="utf-8")
    return path


def end_to_end(model_type: str, folder: Path, reviews: Path, data_dir: Path) -> list[str]:
    """``attnaudit explain`` and ``attnaudit audit`` command lines for a saved tiny ``model_type`` (placeholders filled):
    a decoder explains two generated tokens, an encoder-decoder each token of a forced target, an encoder its class."""
    kind = ARCHITECTURES[model_type]
    if kind == "encoder-decoder":
        return [
            f"explain --hf {folder} --text 'the film was good' --target 'a good' --out {folder}-explain",
            f"audit --hf {folder} --task europarl-deen --data-dir {data_dir} --only alignment,identifiability "
            f"--limit 4 --no-figures --explore 0 --quiet --out {folder}-audit",
        ]
    zero_shot = f" --prompt '{PROMPT}' --verbalizer '{VERBALIZER}'" if kind == "decoder" else ""
    return [
        f"explain --hf {folder} --text 'the film was good'{' --generate 2' if kind == 'decoder' else ''} --out {folder}-explain",
        f"audit --hf {folder} --task csv:{reviews}{zero_shot} --only importance,permutation,erasure --limit 6 "
        f"--no-figures --explore 0 --quiet --out {folder}-audit",
    ]




def check(model_type: str, seed: int = 0) -> dict[str, Any]:
    """Check the adapter on a tiny ``model_type`` against the same weights run by transformers' eager code.

    The figures (max absolute differences over real tokens): ``weights``, our captured weights against
    eager ``output_attentions=True`` (None where eager returns none); ``logits``, the decision against
    eager's; ``intervention``, replacing one middle layer's weights through the adapter against
    replacing them by hand inside eager's softmax; ``restart``, restarting at that layer against the
    full pass; ``rows``, the pass that computes only the explanation rows' weights (SDPA for the outputs,
    :meth:`~attnaudit.models.hf.model.HFModel.rows_forward`) against the full one, with ``rows_only_layers`` the
    layers that took that route (None for encoder-decoders); ``logits_only``, the pass read for its logits alone
    (:meth:`~attnaudit.models.hf.model.HFModel.logits_forward`: the last block's tail at the read rows where
    ``read_cut`` names the module cut, else the whole pass) against the full one, logits and input gradients (None
    for encoder-decoders). Also what the dry run found (route, causal, layouts) and which explanation methods apply."""
    from attnaudit.explain import EXPLANATIONS
    from attnaudit.models.hf import BlockLayout, HFLayer, HFModel
    from attnaudit.models.interface import Intervention

    kind = _kind(model_type)
    head = "classifier" if kind == "encoder" else "lm"
    hf, tokenizer = build_tiny(model_type, head, seed)
    reference, _ = build_tiny(model_type, head, seed)
    model = HFModel(hf, tokenizer, "classification", model_type, trained_head=True)
    batch, inputs = _batch(model, tokenizer)
    middle = model.structure.layers_of(1)[0]  # the first attention layer of the second block (of the encoder)
    decoder = model.structure.layers_of(model.structure.sites[model.first_decoder_layer].block + 1)[0] if kind == "encoder-decoder" else middle
    layer = middle
    with torch.no_grad():
        cache = model.encode(batch)
        ours = model.decode(cache)
        theirs = reference(**inputs, output_attentions=True)
        record = ours.trace[layer]
        assert isinstance(record, HFLayer) and record.allowed is not None  # an HF pass records the pairs each query may read
        given = _distributions(record.allowed, record.weights.shape, seed)
        changed = model(batch, [Intervention(layer=layer, weights=given)])
        by_hand = _replaced(reference, inputs, layer, given)
        restarts = [model.decode(model.cache_at(ours.trace, at, cache)).logits for at in {middle, decoder}]
        rows = None if kind == "encoder-decoder" else model.rows_forward(batch)
    layouts = {v.kind if isinstance(v, BlockLayout) else v for v in model.structure.layouts.values()}
    return {
        "model_type": model_type, "kind": kind, "route": model.structure.route, "layers": model.num_attention_layers,
        "causal": model.causal, "layouts": sorted(layouts),
        "weights": _weights_difference(ours.trace.layers, theirs, kind),
        "logits": _difference(ours.logits, _decision(model, theirs, batch)),
        "intervention": _difference(changed.logits, _decision(model, by_hand, batch)),
        "intervention_changes": not torch.allclose(changed.logits, ours.logits),
        "restart": max(_difference(logits, ours.logits) for logits in restarts),
        "restart_layers": sorted({middle, decoder}),
        "methods": {name: method.applies(model) for name, method in EXPLANATIONS.items()} if kind != "encoder-decoder" else {},
        "generation": None if kind == "encoder" else _generation_difference(model, tokenizer),
        "rows": None if rows is None else _rows_difference(model, batch, ours, rows),
        "rows_only_layers": None if rows is None else sum(r.rows is not None for r in rows.trace.layers),
        "logits_only": None if kind == "encoder-decoder" else _logits_only_difference(model, batch),
        "read_cut": None if kind == "encoder-decoder" else _cut_name(model),
    }


def _logits_only_difference(model: Any, batch: Any) -> float:
    """``logits_forward`` against the full pass (eval mode, attention detached as the ``gradient`` method does): the
    largest difference of the logits and of the input gradient of their squares' sum, relative to the largest value."""
    from attnaudit.models.interface import detach_weights, evaluation

    results = []
    with evaluation(model):
        embeddings = model.embed(batch).detach()
        for forward in (model.forward, model.logits_forward):
            given = embeddings.clone().requires_grad_(True)
            logits = forward(batch, [detach_weights()], embeddings=given).logits.float()
            (grad,) = torch.autograd.grad(logits.square().sum(), given)
            results.append((logits.detach(), grad))
    (logits, grad), (fast_logits, fast_grad) = results
    return max(_difference(fast_logits, logits) / (1.0 + float(logits.abs().max())),
               _difference(fast_grad, grad) / (1e-12 + float(grad.abs().max())))


def _cut_name(model: Any) -> str | None:
    """The name of the last block's child that :meth:`~attnaudit.models.hf.model.HFModel.read_cut` cuts at, or None."""
    cut = model.read_cut()
    return None if cut is None else next(name for name, child in cut.block.named_children() if child is cut.module)


def _generation_difference(model: Any, tokenizer: PreTrainedTokenizerFast) -> float:
    """Three tokens of the model's own cached continuation and one teacher-forced pass over them, against each step
    passed through the model interface as one decision: the largest difference of a step's distribution (inf when a
    token is not the interface's most probable)."""
    from attnaudit.explain.generation import step_batches
    from attnaudit.models.interface import evaluation

    source = list(tokenizer(SENTENCES[0])["input_ids"])
    ids, probs = model.continuation(source, 3)
    decision = model.forced_decision() if model.kind == "encoder-decoder" else model.next_token_decision()
    with decision, evaluation(model), torch.no_grad():
        steps = torch.cat([model(batch).probs.float() for batch in step_batches(model, source, ids)])
    if steps.argmax(-1).tolist() != ids:
        return math.inf
    return max(_difference(probs, steps), _difference(model.forced_distributions(source, ids), steps))


def _batch(model: Any, tokenizer: PreTrainedTokenizerFast) -> tuple[Any, dict[str, Tensor]]:
    """A right-padded batch of :data:`SENTENCES` (encoder-decoders: with :data:`TARGETS`) and eager's inputs for it."""
    from attnaudit.data.types import Batch

    encoded = tokenizer(list(SENTENCES), padding=True, return_tensors="pt")
    batch = Batch(tokens=encoded["input_ids"], mask=encoded["attention_mask"].bool(), examples=[])
    inputs = {"input_ids": batch.tokens, "attention_mask": batch.mask.long()}
    if model.kind == "encoder-decoder":
        labels = tokenizer(list(TARGETS), padding=True, return_tensors="pt")
        start = torch.full((len(TARGETS), 1), model.decoder_start)
        batch.target = torch.cat([start, labels["input_ids"][:, :-1]], 1)
        batch.target_mask = torch.cat([torch.ones_like(start, dtype=torch.bool), labels["attention_mask"][:, :-1].bool()], 1)
        inputs.update(decoder_input_ids=batch.target, decoder_attention_mask=batch.target_mask.long())
    return batch, inputs


def _distributions(allowed: Tensor, shape: torch.Size, seed: int) -> Tensor:
    """Random attention distributions of ``shape`` over the ``allowed`` keys (rows with none stay zero)."""
    generator = torch.Generator().manual_seed(seed + 1)
    weights = torch.rand(shape, generator=generator) * allowed.expand(shape)
    return weights / weights.sum(-1, keepdim=True).clamp_min(1e-12)


def _replaced(reference: PreTrainedModel, inputs: dict[str, Tensor], layer: int, given: Tensor) -> Any:
    """Eager's forward with attention layer ``layer``'s softmax (the ``layer``-th over keys) returning ``given``."""
    plain = torch.nn.functional.softmax
    seen = [0]

    def softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: torch.dtype | None = None) -> Tensor:
        out = plain(input, dim, _stacklevel, dtype)
        if input.dim() == 4 and dim in (-1, 3):
            seen[0] += 1
            if seen[0] == layer + 1:
                return given.to(out.dtype)
        return out

    torch.nn.functional.softmax = softmax
    try:
        return reference(**inputs)
    finally:
        torch.nn.functional.softmax = plain


def _decision(model: Any, output: Any, batch: Any) -> Tensor:
    """Eager's logits of the decision the adapter makes: a decoder's next token at its last real token."""
    logits = output.logits
    if model.kind == "decoder" and not model.has_head:
        last = batch.mask.long().sum(1) - 1
        return logits[torch.arange(len(last)), last]
    return logits


def _difference(a: Tensor, b: Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def _rows_difference(model: Any, batch: Any, full: Any, rows: Any) -> float:
    """A pass computing only the explanation rows' weights (SDPA for the outputs) against the full pass: the largest
    difference of its decision and of every layer's weights at those rows."""
    from attnaudit.models.interface import take_rows

    worst = _difference(rows.logits, full.logits)
    wanted = model.explanation_rows(batch.mask)
    for whole, kept in zip(full.trace.layers, rows.trace.layers, strict=True):
        expected = take_rows(whole.weights, wanted, 2)
        got = kept.weights[:, :, 0] if kept.rows is not None else take_rows(kept.weights, wanted, 2)
        worst = max(worst, _difference(got * whole.mask[:, None], expected * whole.mask[:, None]))
    return worst


def _weights_difference(records: list[Any], output: Any, kind: str) -> float | None:
    """Max difference of the captured weights to eager's over real query rows; None where eager returns none."""
    if kind == "encoder-decoder":
        stacks = (output.encoder_attentions, output.decoder_attentions, output.cross_attentions)
        if any(s is None for s in stacks):
            return None
        eager = list(stacks[0]) + [w for pair in zip(stacks[1], stacks[2]) for w in pair]
    else:
        if output.attentions is None:
            return None
        eager = list(output.attentions)
    worst = 0.0
    for record, weights in zip(records, eager, strict=True):
        rows = record.query_mask if record.query_mask is not None else record.mask
        worst = max(worst, float(((record.weights - weights).abs() * rows[:, None, :, None]).max()))
    return worst
