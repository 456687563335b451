"""Hugging Face encoder-decoders (BART, Marian, T5) behind the one model interface.

The same mechanism as the encoders and decoders (:mod:`attnaudit.models.hf_encoder`), no forked
modeling file: every attention module calls the registered ``"attnaudit"`` function, and
:meth:`HFSeq2SeqModel.decode` runs the model's own layer modules one by one.

* **Trace layout** (as our NMT model, :class:`~attnaudit.models.seq2seq.Seq2SeqTransformer`):
  ``enc0..enc{E-1}`` (encoder self-attention), then per decoder block ``self{l}`` (causal) and
  ``cross{l}``; trace index ``E + 2l + 1`` is the cross-attention of block ``l``
  (:attr:`HFSeq2SeqModel.cross_layers`). A cross-attention record has weights
  ``(B,H,T_tgt,T_src)``, ``mask`` the source mask, ``query_mask`` the target mask and ``inputs``
  the encoder output (the vectors that are weighted), so the norm analysis and the alignment
  test read it unchanged.
* **Masks** per layer (``_Active.layer_masks``): encoder keys are the real source tokens; decoder
  self-attention is causal over real target tokens; cross-attention reads the real source tokens.
  Weight replacements are restricted to them as for decoder-only models.
* **Positions.** Everything before the first layer (token embeddings with their scale, learned or
  sinusoidal positions, BART's embedding LayerNorm, dropout) is the model's own code: ``encode``
  runs the encoder (and the decoder) stack until its first layer is called. T5's relative position
  bias is computed once per stack by its first block, as HF does, and passed to every layer, so a
  restart at layer ``k`` sees the same bias.
* **Restarts** at an encoder layer or a decoder ``self{l}`` layer, from the residual stream that
  entered the block (T5 is pre-norm: a record's ``inputs`` are its normalised states); a ``cross{l}``
  layer's queries are an intermediate state of the block and are refused, as for our NMT model.

Batches follow :class:`~attnaudit.data.alignment.Seq2SeqCollator`: ``tokens`` the source ids (the
tokenizer's specials included), ``target`` the decoder input (the decoder start token, then the
labels shifted right), ``labels`` the target ids with the tokenizer's specials; logits are
``(B, T_tgt, V)``, position ``p`` predicting ``labels[:, p]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from attnaudit.data.batching import IGNORE_INDEX, _pad
from attnaudit.data.types import Batch, Example
from attnaudit.errors import AttnAuditError, InputError, warn
from attnaudit.models.base import (
    AttentionLayer,
    AttentionModel,
    AttentionTrace,
    Cache,
    Intervention,
    ModelConfig,
    ModelOutput,
    interventions_for,
)
from attnaudit.models.hf_decoder import DecoderAttentionLayer, causal_allowed
from attnaudit.models.hf_encoder import (
    _ACTIVE,
    ATTN_IMPLEMENTATION,
    HFAttentionModel,
    _Active,
    _check_weights,
    _pretrained,
)
from attnaudit.models.seq2seq import EncoderDecoderLayout

SEQ2SEQ_TYPES = ("marian", "bart", "mbart", "t5")
"""``config.model_type`` values handled here (tested on tiny random configs of marian, bart and t5)."""
HUB_EXAMPLE = "Helsinki-NLP/opus-mt-de-en"


def is_seq2seq_config(config: Any) -> bool:
    """Whether a loaded HF config is an encoder-decoder (BART, Marian, T5, ...)."""
    return bool(getattr(config, "is_encoder_decoder", False))


class _Stop(Exception):
    """Raised by a pre-hook on a stack's first layer: carries the states entering it."""

    def __init__(self, states: Tensor) -> None:
        super().__init__("first layer reached")
        self.states = states


def states_entering(first_layer: nn.Module, run_stack: Callable[[], Any]) -> Tensor:
    """The states the model's own stack hands to ``first_layer`` (embeddings, positions, norm, dropout):
    the stack is run until that layer is called."""

    def stop(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        raise _Stop(args[0] if args else kwargs["hidden_states"])

    handle = first_layer.register_forward_pre_hook(stop, with_kwargs=True)
    try:
        run_stack()
    except _Stop as reached:
        return reached.states
    finally:
        handle.remove()
    raise AttnAuditError(f"{type(first_layer).__name__} was never called: unsupported encoder-decoder")


def _blocks(stack: nn.Module) -> nn.ModuleList:
    """A stack's layer list: ``layers`` (BART, Marian) or ``block`` (T5)."""
    for name in ("layers", "block"):
        blocks = getattr(stack, name, None)
        if isinstance(blocks, nn.ModuleList):
            return blocks
    raise AttnAuditError(f"unsupported Hugging Face encoder-decoder stack {type(stack).__name__}: no layer list")


def _attentions(block: nn.Module, cross: bool) -> list[nn.Module]:
    """The self-attention (and, ``cross``, the cross-attention) module of one block."""
    if hasattr(block, "layer"):  # T5Block: [self, (cross,) feed-forward]
        return [block.layer[0].SelfAttention] + ([block.layer[1].EncDecAttention] if cross else [])
    return [block.self_attn] + ([block.encoder_attn] if cross else [])


def _finish(stack: nn.Module, states: Tensor) -> Tensor:
    """What a stack applies after its last layer: T5's final RMSNorm and dropout, mBART's LayerNorm."""
    for name in ("final_layer_norm", "layer_norm"):
        norm = getattr(stack, name, None)
        if isinstance(norm, nn.Module):
            states = norm(states)
    dropout = getattr(stack, "dropout", None)
    return dropout(states) if isinstance(dropout, nn.Dropout) else states


class HFSeq2SeqModel(EncoderDecoderLayout, HFAttentionModel):
    """An encoder-decoder HF model with its LM head (``AutoModelForSeq2SeqLM``) as an AttentionModel;
    ``forward(batch)`` is teacher-forced on ``batch.target``. ``explained_layer`` is the last cross-attention."""

    explanation_query = None
    self_attention = False
    has_value_output = True

    def __init__(self, hf: nn.Module, tokenizer: Any, source: str, trained_head: bool = True) -> None:
        cfg = hf.config
        if not is_seq2seq_config(cfg):
            raise AttnAuditError(f"{source} is not an encoder-decoder model ({cfg.model_type})")
        encoder_blocks, decoder_blocks = _blocks(hf.get_encoder()), _blocks(hf.get_decoder())
        modules = [_attentions(b, False)[0] for b in encoder_blocks]
        modules += [m for b in decoder_blocks for m in _attentions(b, True)]
        width = int(cfg.d_model)
        config = ModelConfig(
            model="hf",
            task_type="seq2seq",
            vocab_size=int(cfg.vocab_size),
            num_labels=int(getattr(cfg, "decoder_vocab_size", None) or cfg.vocab_size),
            embed_dim=width,
            hidden_dim=width,
            attention="softmax",
            layers=len(encoder_blocks),
            heads=int(getattr(cfg, "encoder_attention_heads", None) or cfg.num_heads),
            d_model=width,
            d_ff=int(getattr(cfg, "encoder_ffn_dim", None) or cfg.d_ff),
            dropout=float(getattr(cfg, "dropout", None) or getattr(cfg, "dropout_rate", 0.0) or 0.0),
            max_len=int(getattr(cfg, "max_position_embeddings", None) or getattr(tokenizer, "model_max_length", 512) or 512),
            pad_id=int(tokenizer.pad_token_id or 0),
            extra={
                "hf_type": str(cfg.model_type), "source": source, "head": True, "trained_head": trained_head,
                "encoder_decoder": True, "decoder_layers": len(decoder_blocks), "output": "translation",
            },
        )
        config.max_len = min(config.max_len, int(getattr(tokenizer, "model_max_length", 0) or 2**31))
        AttentionModel.__init__(self, config)  # HFAttentionModel.__init__ is encoder-specific
        self.hf_type = str(cfg.model_type)
        self.has_head = True
        self.hf = hf
        self.tokenizer = tokenizer
        self.trained_head = trained_head
        self.uses_token_types = False
        self._attention_modules = modules
        self._layer_of = {id(m): i for i, m in enumerate(modules)}
        self.explained_layer = len(modules) - 1
        hf.set_attn_implementation(ATTN_IMPLEMENTATION)

    # -- structure -------------------------------------------------------------------------

    @property
    def encoder_blocks(self) -> nn.ModuleList:
        """The encoder's layer modules."""
        return _blocks(self.hf.get_encoder())

    @property
    def decoder_blocks(self) -> nn.ModuleList:
        """The decoder's layer modules."""
        return _blocks(self.hf.get_decoder())

    @property
    def layers(self) -> nn.ModuleList:
        """The encoder's layer list."""
        return self.encoder_blocks

    def _layout(self) -> tuple[int, int]:
        return len(self.encoder_blocks), len(self.decoder_blocks)

    def value_output_maps(self, layer: int) -> tuple[Tensor, Tensor, Tensor, int]:
        """``(W_V, b_V, W_O, heads)`` of trace layer ``layer`` as right-multiplied maps (T5: no value bias, zeros)."""
        module = self._attention_modules[self._resolve(layer)]
        values, output = (module.v_proj, module.out_proj) if hasattr(module, "v_proj") else (module.v, module.o)
        w_v = values.weight.t()
        b_v = values.bias if values.bias is not None else w_v.new_zeros(w_v.shape[1])
        heads = int(getattr(module, "num_heads", None) or module.n_heads)
        return w_v, b_v, output.weight.t(), heads

    @property
    def special_tokens(self) -> dict[str, str]:
        """The tokenizer's end-of-sequence and padding strings."""
        names = {"eos": self.tokenizer.eos_token, "pad": self.tokenizer.pad_token}
        return {name: str(token) for name, token in names.items() if token}

    # -- the interface -----------------------------------------------------------------------

    def embed(self, batch: Batch) -> Tensor:
        """Source token embeddings ``(B,S,d)`` with the encoder's embedding scale (the gradient target)."""
        ids = batch.tokens
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size):
            raise AttnAuditError(f"token ids must lie in [0, {self.config.vocab_size}); got {int(ids.min())}..{int(ids.max())}")
        encoder = self.hf.get_encoder()
        return encoder.embed_tokens(ids) * getattr(encoder, "embed_scale", 1.0)

    def encode(self, batch: Batch, embeddings: Tensor | None = None) -> Cache:
        """States entering encoder layer 0 (the model's own embedding code); the decoder's, from
        ``batch.target``, ride in ``extra``."""
        for ids, what in ((batch.tokens, "source"), (batch.target, "target")):
            if ids is not None and ids.shape[1] > self.config.max_len:
                raise AttnAuditError(f"{what} sequence of length {ids.shape[1]} exceeds max_len={self.config.max_len}")
        emb = self.embed(batch) if embeddings is None else embeddings
        mask = batch.mask.bool()
        encoder, decoder = self.hf.get_encoder(), self.hf.get_decoder()
        states = states_entering(self.encoder_blocks[0], lambda: encoder(inputs_embeds=emb, attention_mask=mask.long()))
        extra: dict[str, Any] = {}
        if batch.target is not None:
            if batch.target_mask is None:
                raise AttnAuditError("a seq2seq batch with target needs target_mask")
            target_mask = batch.target_mask.bool()
            target = states_entering(
                self.decoder_blocks[0], lambda: decoder(input_ids=batch.target, attention_mask=target_mask.long(), use_cache=False)
            )
            extra = {"target_states": target, "target_mask": target_mask}
        return Cache(states=states, mask=mask, layer=0, extra=extra)

    def _position_bias(self, blocks: nn.ModuleList, length: int, device: torch.device) -> Tensor | None:
        """T5's relative position bias of a stack (computed by its first block, shared by all); None elsewhere."""
        first = _attentions(blocks[0], False)[0]
        if not getattr(first, "has_relative_attention_bias", False):
            return None
        return first.compute_bias(length, length, device=device)

    def _block(self, block: nn.Module, x: Tensor, bias: Tensor | None, memory: Tensor | None = None) -> Tensor:
        """One encoder (``memory`` None) or decoder block with the model's own module; masks are ours."""
        if hasattr(block, "layer"):  # T5Block(hidden, mask, position_bias, encoder states, encoder mask, cross bias)
            out = block(x, None, bias) if memory is None else block(x, None, bias, memory, None, None, past_key_values=None)
        elif memory is None:
            out = block(x, None)
        else:
            out = block(x, None, memory, encoder_attention_mask=None, past_key_values=None, use_cache=False)
        return out[0] if isinstance(out, tuple) else out

    def decode(
        self, cache: Cache, interventions: Sequence[Intervention] = (), start_layer: int | None = None
    ) -> ModelOutput:
        """Attention layer ``start_layer`` (default ``cache.layer``: an encoder layer or a decoder ``self{l}``)
        onwards, then the decoder's final norm and the LM head (logits ``(B,T_tgt,V)``)."""
        n, total = len(self.encoder_blocks), self.num_attention_layers
        start = self._resolve(cache.layer if start_layer is None else start_layer)
        if start >= n and (start - n) % 2:
            raise AttnAuditError(
                f"cannot restart at cross-attention layer {start} ({self.layer_name(start)}); "
                f"restart at {self.layer_name(start - 1)} (layer {start - 1})"
            )
        if start < n and "target_states" not in cache.extra:
            raise AttnAuditError("an encoder-decoder's forward is teacher-forced: the batch needs a target")
        state = _Active(layer_of=self._layer_of, mask=cache.mask.bool(),
                        interventions={l: interventions_for(interventions, l, total) for l in range(total)})

        def capture(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            memory = kwargs.get("key_value_states")
            state.inputs = memory if memory is not None else (args[0] if args else kwargs["hidden_states"])

        hooks = [m.register_forward_pre_hook(capture, with_kwargs=True) for m in self._attention_modules]
        token = _ACTIVE.set(state)
        trace = AttentionTrace()
        try:
            if start < n:
                memory, memory_mask = self._run_encoder(cache.states, cache.mask.bool(), start, state, trace), cache.mask.bool()
                x, target_mask, first = cache.extra["target_states"], cache.extra["target_mask"], 0
            else:
                memory, memory_mask = cache.extra["memory"], cache.extra["memory_mask"]
                x, target_mask, first = cache.states, cache.mask.bool(), (start - n) // 2
            x = self._run_decoder(x, target_mask, memory, memory_mask, first, state, trace)
        finally:
            _ACTIVE.reset(token)
            for hook in hooks:
                hook.remove()
        return ModelOutput(logits=self.head(_finish(self.hf.get_decoder(), x)), trace=trace)

    def _run_encoder(self, x: Tensor, mask: Tensor, start: int, state: _Active, trace: AttentionTrace) -> Tensor:
        """Encoder layers ``start``.. and the encoder's final norm: the memory the decoder reads."""
        bias = self._position_bias(self.encoder_blocks, x.shape[1], x.device)
        state.allowed = None
        for index in range(start, len(self.encoder_blocks)):
            x_in, x = x, self._block(self.encoder_blocks[index], x, bias)
            trace.layers.append(self._record(state, index, f"enc{index}", x_in, x))
        return _finish(self.hf.get_encoder(), x)

    def _run_decoder(
        self, x: Tensor, mask: Tensor, memory: Tensor, memory_mask: Tensor, first: int, state: _Active, trace: AttentionTrace
    ) -> Tensor:
        """Decoder blocks ``first``..: causal self-attention over real target tokens, cross-attention over real source tokens."""
        n = len(self.encoder_blocks)
        bias = self._position_bias(self.decoder_blocks, x.shape[1], x.device)
        causal = causal_allowed(mask)
        for block in range(first, len(self.decoder_blocks)):
            index = n + 2 * block
            state.layer_masks = {index: (mask, causal, mask), index + 1: (memory_mask, None, mask)}
            x_in, x = x, self._block(self.decoder_blocks[block], x, bias, memory)
            trace.layers += [self._record(state, index, f"self{block}", x_in, None),
                             self._record(state, index + 1, f"cross{block}", None, None)]
        return x

    @staticmethod
    def _record(state: _Active, index: int, name: str, residual: Tensor | None, outputs: Tensor | None) -> AttentionLayer:
        """The record the attention function left for layer ``index``, named, with the block's residual input."""
        record = state.records.pop(index)
        return DecoderAttentionLayer(
            weights=record.weights, mask=record.mask, inputs=record.inputs, keys=record.keys, values=record.values,
            scores=record.scores, query_mask=record.query_mask, name=name, outputs=outputs, residual=residual,
        )

    def head(self, states: Tensor) -> Tensor:
        """The LM head on final decoder states (T5: scaled by ``d_model^-½`` when tied; BART/Marian: plus ``final_logits_bias``)."""
        hf = self.hf
        if getattr(hf.config, "scale_decoder_outputs", False):
            states = states * (hf.config.d_model**-0.5)
        logits = hf.lm_head(states)
        bias = getattr(hf, "final_logits_bias", None)
        return logits if bias is None else logits + bias

    def cache_at(self, trace: AttentionTrace, layer: int, base: Cache) -> Cache:
        """Restart at encoder layer ``layer`` or decoder ``self{l}`` of a full trace, from the residual stream
        that entered that block."""
        n = len(self.encoder_blocks)
        layer = self._resolve(layer)
        if len(trace) != self.num_attention_layers:
            raise AttnAuditError("cache_at needs the full trace of a forward pass")
        entry = trace[layer]
        if layer >= n and (layer - n) % 2:
            raise AttnAuditError(f"cannot restart at cross-attention layer {layer}; restart at layer {layer - 1}")
        residual = getattr(entry, "residual", None)
        if residual is None:
            raise AttnAuditError("cache_at needs a trace from HFSeq2SeqModel.decode")
        if layer < n:
            return Cache(states=residual, mask=entry.mask, layer=layer, extra=dict(base.extra))
        cross = trace[layer + 1]
        extra = {**base.extra, "memory": cross.inputs, "memory_mask": cross.mask}
        return Cache(states=residual, mask=entry.query_mask, layer=layer, extra=extra)

    @torch.no_grad()
    def greedy(self, batch: Batch, max_len_a: float = 1.5, max_len_b: int = 10) -> list[list[int]]:
        """Greedy decoding with HF's ``generate`` (one beam, no sampling): target ids per example, without
        the decoder start token, ``</s>`` or padding; at most ``max_len_a * source_length + max_len_b`` steps."""
        was_training = self.training
        self.eval()
        steps = min(int(max_len_a * int(batch.mask.sum(1).max()) + max_len_b), self.config.max_len - 1)
        out = self.hf.generate(
            input_ids=batch.tokens, attention_mask=batch.mask.long(), do_sample=False, num_beams=1, max_new_tokens=steps,
        )
        self.train(was_training)
        eos, specials = self.tokenizer.eos_token_id, set(self.tokenizer.all_special_ids)
        rows = []
        for row in out[:, 1:].tolist():
            row = row[: row.index(eos)] if eos in row else row
            rows.append([i for i in row if i not in specials])
        return rows


# -- batches -----------------------------------------------------------------------------------


class HFSubwords:
    """One side of a sentence pair through an HF tokenizer, as :class:`~attnaudit.data.alignment.SubwordTokenizer`:
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
        from attnaudit.data.alignment import tokenize

        return tokenize(self.tokenizer.decode(list(ids), skip_special_tokens=True))


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
        tokens, mask = _pad(sources, self.pad_id)
        batch = Batch(tokens=tokens, mask=mask, examples=list(examples))
        if labels:
            batch.target, batch.target_mask = _pad([[self.decoder_start] + ids[:-1] for ids in labels], self.pad_id)
            batch.labels, _ = _pad(labels, IGNORE_INDEX)
        if truncated:
            warn(f"{truncated} sequence(s) in a batch of {len(examples)} exceeded max_len={self.max_len}; truncated")
        return batch


def collator(model: HFSeq2SeqModel) -> HFSeq2SeqCollator:
    """The batches ``model`` reads: its tokenizer, ``max_len`` and decoder start token."""
    start = model.hf.config.decoder_start_token_id
    if start is None:
        raise AttnAuditError(f"{model.config.extra.get('source')}: the model config names no decoder_start_token_id")
    return HFSeq2SeqCollator(model.tokenizer, model.config.max_len, int(start))


# -- loading -----------------------------------------------------------------------------------


def build_seq2seq_model(source: str, trained_head: bool | None = None) -> HFSeq2SeqModel:
    """Load an encoder-decoder with its LM head (a folder or hub name; safetensors only) and wrap it."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    hf = _pretrained(AutoModelForSeq2SeqLM, source, attn_implementation="eager", use_safetensors=True, dtype=torch.float32)
    _check_weights(source, hf)
    try:
        tokenizer = _pretrained(AutoTokenizer, source)
    except ImportError as exc:  # Marian's and T5's SentencePiece tokenizers need the sentencepiece package
        raise AttnAuditError(f"could not load the tokenizer of {source}: {str(exc).strip().splitlines()[0]} (pip install sentencepiece)") from None
    return HFSeq2SeqModel(hf, tokenizer, source, True if trained_head is None else trained_head)


# -- a fresh model to train from scratch ----------------------------------------------------------

ARCHITECTURES = ("marian", "bart")
"""Encoder-decoder configurations ``train-nmt --arch`` builds from scratch (beside our own ``nmt``)."""


def fresh_tokenizer(subwords: Any) -> Any:
    """A transformers tokenizer around a joint :class:`~attnaudit.data.alignment.SubwordTokenizer`
    (``<pad>`` 0, ``<unk>`` 1, ``<s>`` 2, ``</s>`` 3): ``</s>`` appended, ``##`` pieces joined when decoding."""
    import copy

    from tokenizers import decoders, processors
    from transformers import PreTrainedTokenizerFast

    from attnaudit.data.alignment import CONTINUATION, EOS, EOS_ID

    core = copy.deepcopy(subwords.tokenizer)
    core.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, EOS_ID)])
    core.decoder = decoders.WordPiece(prefix=CONTINUATION)
    # No model_max_length: sentences are measured before they are cut (fits_length), and the model's
    # own limit (max_position_embeddings) caps batches.
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token=EOS)


def fresh_seq2seq(arch: str, tokenizer: Any, layers: int, heads: int, d_model: int, d_ff: int, dropout: float, max_len: int) -> HFSeq2SeqModel:
    """A randomly initialised Marian or BART model of the given size over ``tokenizer``'s joint vocabulary
    (embeddings shared by encoder, decoder and LM head; the decoder starts from ``<pad>`` as Marian's do)."""
    from transformers import BartConfig, BartForConditionalGeneration, MarianConfig, MarianMTModel

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
        hf: nn.Module = MarianMTModel(MarianConfig(decoder_vocab_size=len(tokenizer), **size))
    else:
        hf = BartForConditionalGeneration(BartConfig(**size))
    hf.config.architectures = [type(hf).__name__]
    return HFSeq2SeqModel(hf.eval(), tokenizer, f"fresh {arch}", trained_head=True)
