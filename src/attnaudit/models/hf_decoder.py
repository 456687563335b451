"""Decoder-only Hugging Face language models (Llama/SmolLM2, Qwen2, GPT-2) behind the one model interface.

Same mechanism as the encoders of :mod:`attnaudit.hf`, and no forked modeling file:
every attention module calls the ``"attnaudit"`` function registered there, and
:meth:`HFDecoderModel.decode` runs the model's own decoder layers one by one. What differs:

* **Causal mask.** Query ``i`` reads keys ``j <= i`` that are real (Qwen2's sliding-window
  layers: also ``i - j < window``). The mask is passed to the attention function per layer;
  a weight replacement (tensor or function) is restricted to it afterwards
  (:func:`attnaudit.models.attention.restrict`), so freezing to uniform means uniform over
  the keys each token sees, and no intervention lets a token read a later one.
* **Positions.** Rotary embeddings (Llama, Qwen2) are computed once from the position ids by
  the model's own ``rotary_emb`` and passed to each layer; GPT-2 adds its learned position
  embeddings in :meth:`~HFDecoderModel.encode`. Position ids count real tokens
  (``cumsum(mask) - 1``), so left- and right-padded batches both give each real token the
  position it has alone.
* **Padding: right.** The collator pads on the right, as the rest of attnaudit assumes (real
  items are the first ``n`` positions of a row). Under a causal mask no real token reads a
  later pad, so real tokens' states equal the unpadded run's; the price is that the
  explaining query, the last real token, differs per example
  (:meth:`~HFDecoderModel.explanation_rows`).
* **Grouped-query attention.** Key/value heads are repeated to the query heads as HF's
  ``repeat_kv`` does; the trace's weights, keys and values are per query head ``(B,H,…)``,
  and :meth:`~HFDecoderModel.value_output_maps` gives each query head the value head it reads.
* **Pre-norm layers.** A trace layer's ``inputs`` are the normalised states the projections
  read (so ``inputs @ W_V + b_V`` are its values); ``residual`` is the residual stream that
  entered the block, which :meth:`~HFDecoderModel.cache_at` restarts from.

Outputs: with a sequence-classification head, its logits at the last real token (HF's own
pooling); a causal LM gives the next-token logits ``(B, vocab)`` at the last real token (zero-shot:
only those of the verbalizer tokens, :mod:`attnaudit.models.zeroshot`); a bare
decoder its final state there.
"""

from __future__ import annotations

import contextlib
import struct
from functools import partial
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnaudit.data.types import Batch
from attnaudit.errors import AttnAuditError, InputError
from attnaudit.models import gguf_cache
from attnaudit.models.base import (
    AttentionLayer,
    AttentionModel,
    AttentionTrace,
    Cache,
    Intervention,
    ModelConfig,
    ModelOutput,
    NormParams,
    ResidualNorms,
    interventions_for,
    layer_range,
)
from attnaudit.models.hf_encoder import (
    _ACTIVE,
    ATTN_IMPLEMENTATION,
    HFAttentionModel,
    _Active,
    _check_weights,
    _pretrained,
    _quiet_transformers,
)
from attnaudit.models.lrp import RelevanceSites

DECODER_TYPES = ("llama", "qwen2", "gpt2")
"""``config.model_type`` values handled here (tested on tiny random configs of each)."""
GGUF_INSTALL = "pip install gguf==0.19.0 accelerate==1.15.0"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""Parameter dtypes a decoder can be loaded in (``--dtype``); float32 is the default and the reference."""
LayerCallback = Callable[[int, "DecoderAttentionLayer"], None]
"""``fn(layer index, that layer's record)``, called as each layer finishes (:meth:`HFDecoderModel.decode`)."""


def is_decoder_config(config: Any) -> bool:
    """Whether a loaded HF config is a decoder-only family handled here."""
    return str(getattr(config, "model_type", "")) in DECODER_TYPES


@dataclass
class DecoderAttentionLayer(AttentionLayer):
    """An :class:`AttentionLayer` of a pre-norm decoder: ``inputs`` are the normalised states the
    projections read; ``residual`` ``(B,K,d)`` the residual stream that entered the block."""

    residual: Tensor | None = None


@dataclass
class KeyValuePrefix:
    """Keys and values of tokens already run, which a continuation attends to.

    ``keys[l]``/``values[l]`` ``(B, kv_heads, P, dh)``: layer ``l``'s keys (rotary positions
    applied) and values; ``mask`` ``(B,P)`` marks the real ones. Given as ``cache.extra["prefix"]``
    to :meth:`HFDecoderModel.decode`, it plays a transformers ``Cache``'s part: each attention
    module hands it its new keys and values (``update``) and attends over what comes back.

    Two uses. ``positions`` None: the continuation's tokens *follow* the prefix (row ``b`` holds
    its first ``mask[b].sum()`` tokens) and their keys and values are appended (leave-one-out
    reruns the tokens after a removed one). ``positions`` ``(B,Q)``: the prefix holds every
    position of the pass and the continuation reruns the tokens at ``positions`` only, their
    new keys and values in place of the pass's (an intervention at the predicting token alone:
    :meth:`HFDecoderModel.rerun_cache`).
    """

    keys: list[Tensor | None]
    values: list[Tensor | None]
    mask: Tensor
    positions: Tensor | None = None

    def update(self, key: Tensor, value: Tensor, layer_idx: int, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        """Layer ``layer_idx``'s keys and values: the prefix's, then ``key``/``value``; or, rerunning
        ``positions``, the prefix's with those positions' entries replaced by ``key``/``value``."""
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        if keys is None or values is None:
            raise AttnAuditError(f"this key/value prefix holds nothing for layer {layer_idx}")
        if self.positions is not None:
            index = self.positions[:, None, :, None].expand(-1, key.shape[1], -1, key.shape[-1])
            return keys.scatter(2, index, key), values.scatter(2, index, value)
        return torch.cat([keys, key], 2), torch.cat([values, value], 2)

    def select_rows(self, rows: Tensor) -> KeyValuePrefix:
        """The prefix of instances ``rows`` (repeats allowed), as :meth:`Cache.select` asks of extras."""
        return KeyValuePrefix(
            keys=[None if k is None else k.index_select(0, rows) for k in self.keys],
            values=[None if v is None else v.index_select(0, rows) for v in self.values],
            mask=self.mask.index_select(0, rows),
            positions=None if self.positions is None else self.positions.index_select(0, rows),
        )


def real_positions(mask: Tensor) -> Tensor:
    """Position ids ``(B,T)`` counting real tokens only (0 for leading pads)."""
    return (mask.long().cumsum(1) - 1).clamp_min(0)


def causal_allowed(mask: Tensor, window: int | None = None, queries: Tensor | None = None) -> Tensor:
    """``(B,Q,K)``: query ``i`` may read key ``j`` when ``j <= i`` (and ``i - j < window``) and ``j`` is real.

    ``queries`` ``(B,Q)``: the key positions of the queries (default: every position, ``Q = K``)."""
    index = torch.arange(mask.shape[1], device=mask.device)
    at = index[None, :, None] if queries is None else queries[:, :, None]
    distance = at - index[None, None, :]
    allowed = distance >= 0
    if window is not None:
        allowed = allowed & (distance < window)
    return allowed & mask[:, None, :].bool()


class HFDecoderModel(HFAttentionModel):
    """A decoder-only HF model (causal LM, sequence classifier or bare decoder) as an AttentionModel.

    Shares :class:`HFAttentionModel`'s attributes (``hf``, ``tokenizer``, ``has_head``,
    ``trained_head``) and saving; everything layer-specific is overridden here.
    """

    explained_layer = -1
    explanation_query = None
    """Per example, not fixed: see :meth:`explanation_rows` (the last real token)."""
    causal = True
    has_value_output = True
    streams_layers = True
    verbalizer_ids: Tensor | None = None
    """Zero-shot classification (:mod:`attnaudit.models.zeroshot`): the next-token logits read at these ids."""

    def __init__(self, hf: nn.Module, tokenizer: Any, task_type: str, source: str, trained_head: bool) -> None:
        cfg = hf.config
        if not is_decoder_config(cfg):
            raise AttnAuditError(
                f"unsupported decoder {cfg.model_type!r} from {source}; decoder-only families handled: {', '.join(DECODER_TYPES)}"
            )
        layers = self._find_layers(hf.base_model)
        heads = int(cfg.num_attention_heads)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
        width = int(cfg.hidden_size)
        has_head = hasattr(hf, "score")
        if tokenizer.pad_token is None:  # GPT-2 has none; pads are masked, so any id will do
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "right"
        output = "classes" if has_head else "next_token" if hasattr(hf, "lm_head") else "states"
        config = ModelConfig(
            model="hf",
            task_type=task_type,  # type: ignore[arg-type]
            vocab_size=int(cfg.vocab_size),
            num_labels=int(cfg.num_labels) if has_head else 0,
            embed_dim=width,
            hidden_dim=width,
            attention="softmax",
            layers=len(layers),
            heads=heads,
            d_model=width,
            d_ff=int(getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 4 * width),
            dropout=float(getattr(cfg, "attention_dropout", getattr(cfg, "attn_pdrop", 0.0)) or 0.0),
            max_len=min(int(cfg.max_position_embeddings), int(getattr(tokenizer, "model_max_length", 0) or 2**31)),
            pad_id=int(tokenizer.pad_token_id or 0),
            extra={
                "hf_type": str(cfg.model_type), "source": source, "head": has_head, "trained_head": trained_head,
                "decoder": True, "kv_heads": self.kv_heads, "output": output,
            },
        )
        # HFAttentionModel.__init__ is encoder-specific (layer lookup, [CLS] pooling, token types).
        AttentionModel.__init__(self, config)
        self.hf_type = str(cfg.model_type)
        self.has_head = has_head
        self.hf = hf
        self.tokenizer = tokenizer
        self.trained_head = trained_head
        self.uses_token_types = False
        self._attention_modules = [self._self_attention(layer) for layer in layers]
        self._layer_of = {id(m): i for i, m in enumerate(self._attention_modules)}
        hf.set_attn_implementation(ATTN_IMPLEMENTATION)

    # -- structure -------------------------------------------------------------------------

    @staticmethod
    def _find_layers(base: nn.Module) -> nn.ModuleList:
        """The decoder's layer list: ``layers`` (Llama, Qwen2) or ``h`` (GPT-2)."""
        for name in ("layers", "h"):
            layers = getattr(base, name, None)
            if isinstance(layers, nn.ModuleList):
                return layers
        raise AttnAuditError(f"unsupported Hugging Face decoder {type(base).__name__}: no layer list found")

    @staticmethod
    def _self_attention(layer: nn.Module) -> nn.Module:
        """The module that calls the attention function (Llama/Qwen2: ``self_attn``; GPT-2: ``attn``)."""
        return layer.self_attn if hasattr(layer, "self_attn") else layer.attn

    def attention_projections(self, layer: int) -> tuple[nn.Module, nn.Module]:
        """The module computing the values (GPT-2: the fused query/key/value ``c_attn``) and the output projection."""
        attn = self._attention_modules[layer]
        return (attn.v_proj, attn.o_proj) if hasattr(attn, "v_proj") else (attn.c_attn, attn.c_proj)

    def value_output_maps(self, layer: int) -> tuple[Tensor, Tensor, Tensor, int]:
        """``(W_V, b_V, W_O, heads)`` per *query* head, as right-multiplied maps.

        With grouped-query attention each key/value head's columns of ``W_V`` (and ``b_V``) are
        repeated for the query heads that read it, so query head ``h`` owns columns
        ``h*dh:(h+1)*dh`` of ``W_V`` and the same rows of ``W_O``. A missing value bias is zeros."""
        values, output = self.attention_projections(layer)
        if isinstance(values, nn.Linear):
            w_v, b_v, w_o = values.weight.t(), values.bias, output.weight.t()
        else:  # GPT-2's Conv1D is already x @ W + b; the values are the last third of c_attn
            width = self.config.d_model
            w_v, b_v, w_o = values.weight[:, 2 * width :], values.bias[2 * width :], output.weight
        if b_v is None:
            b_v = w_v.new_zeros(w_v.shape[1])
        heads, groups = self.config.heads, self.config.heads // self.kv_heads
        if groups > 1:
            dh = w_v.shape[1] // self.kv_heads
            w_v = w_v.reshape(-1, self.kv_heads, dh).repeat_interleave(groups, 1).reshape(w_v.shape[0], heads * dh)
            b_v = b_v.reshape(self.kv_heads, dh).repeat_interleave(groups, 0).reshape(-1)
        return w_v, b_v, w_o, heads

    has_residual_norms = True
    value_interventions = True

    def residual_norms(self, layer: int) -> ResidualNorms:
        """Pre-norm: ``h = x + attn(norm₁(x)) + b_O``, ``out = h + mlp(norm₂(h))`` (Llama/Qwen2: RMSNorm
        ``input_layernorm``/``post_attention_layernorm``; GPT-2: LayerNorm ``ln_1``/``ln_2``)."""
        block = self.layers[layer]
        _, output = self.attention_projections(layer)
        first, second = (block.input_layernorm, block.post_attention_layernorm) if hasattr(block, "input_layernorm") else (block.ln_1, block.ln_2)
        return ResidualNorms(
            placement="pre",
            attention_norm=norm_params(first),
            ffn_norm=norm_params(second),
            output_bias=output.bias,
            ffn=block.mlp,
        )

    def relevance_sites(self) -> RelevanceSites:
        """The encoders' norms and activations, and each gated feed-forward block (Llama, Qwen2:
        ``down_proj(act_fn(gate_proj(x)) · up_proj(x))``) as ``(act_fn, down_proj)``."""
        sites = super().relevance_sites()
        mlps = [layer.mlp for layer in self.layers]
        sites.gates = [(mlp.act_fn, mlp.down_proj) for mlp in mlps if hasattr(mlp, "gate_proj")]
        return sites

    def residual_stream(self, record: AttentionLayer) -> Tensor:
        """The residual stream that entered the layer (``inputs`` are its normalised states)."""
        residual = getattr(record, "residual", None)
        if residual is None:
            raise AttnAuditError("residual_stream needs a trace from HFDecoderModel.decode")
        return residual

    @property
    def special_tokens(self) -> dict[str, str]:
        """The tokenizer's begin/end-of-sequence strings (those it has)."""
        names = {"bos": self.tokenizer.bos_token, "eos": self.tokenizer.eos_token}
        return {name: str(token) for name, token in names.items() if token}

    def explanation_rows(self, query_mask: Tensor) -> Tensor:
        """Each example's last real token ``(B,)``: the position whose state makes the prediction."""
        index = torch.arange(query_mask.shape[1], device=query_mask.device)
        return (index * query_mask.bool()).argmax(1)

    # -- the interface -----------------------------------------------------------------------

    def encode(self, batch: Batch, embeddings: Tensor | None = None) -> Cache:
        """Token embeddings (GPT-2: plus learned positions, then dropout); rotary positions come in ``decode``."""
        if batch.tokens.shape[1] > self.config.max_len:
            raise AttnAuditError(f"sequence of length {batch.tokens.shape[1]} exceeds max_len={self.config.max_len}")
        states = self.embed(batch) if embeddings is None else embeddings
        base = self.hf.base_model
        if hasattr(base, "wpe"):
            states = base.drop(states + base.wpe(real_positions(batch.mask)))
        return Cache(states=states, mask=batch.mask.bool(), layer=0)

    def decode(
        self,
        cache: Cache,
        interventions: Sequence[Intervention] = (),
        start_layer: int | None = None,
        keep_layers: Collection[int] | None = None,
        on_layer: LayerCallback | None = None,
    ) -> ModelOutput:
        """Run decoder layers ``start_layer``..L-1 (default ``cache.layer``) with the model's own modules, then the head.

        Streaming: ``on_layer(index, record)`` sees every layer's record as the layer finishes,
        and the trace keeps only the layers in ``keep_layers`` (negative: from the end; None:
        all), so a caller that folds each layer in (:class:`attnaudit.flow.StreamingRollout`)
        holds one layer's ``(B,H,T,T)`` weights at a time instead of all L layers'.

        Continuation: with a :class:`KeyValuePrefix` in ``cache.extra["prefix"]`` (models where
        :attr:`continues_prefix`), ``cache`` holds the tokens that follow each row's prefix; they
        take the positions after it and read its keys and values, so the output equals that of
        the whole sequence while only the new tokens run. The trace's keys (and ``mask``) are
        then the prefix's followed by the new tokens'."""
        n = self.num_attention_layers
        indices = layer_range(cache, start_layer, n)
        kept = None if keep_layers is None else {layer % n for layer in keep_layers}
        x, mask = cache.states, cache.mask.bool()
        prefix: KeyValuePrefix | None = cache.extra.get("prefix")
        allowed, keys_mask, positions = self._reads(mask, prefix)
        extra: dict[str, Any] = {"position_ids": positions}
        if prefix is not None:
            extra["past_key_values"] = prefix
        rotary = getattr(self.hf.base_model, "rotary_emb", None)
        if rotary is not None:
            extra["position_embeddings"] = rotary(x, positions)
        state = _Active(
            layer_of=self._layer_of, mask=keys_mask, query_mask=mask,
            interventions={l: interventions_for(interventions, l, n) for l in range(n)},
        )

        def capture(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            state.inputs = args[0] if args else kwargs["hidden_states"]

        hooks = [m.register_forward_pre_hook(capture, with_kwargs=True) for m in self._attention_modules]
        token = _ACTIVE.set(state)
        trace = AttentionTrace()
        by_window: dict[int | None, Tensor] = {}  # what a layer may read, per sliding window (None: none)
        try:
            layers = self.layers
            for index in indices:
                window = getattr(self._attention_modules[index], "sliding_window", None)
                window = None if window is None else int(window)
                if window not in by_window:
                    by_window[window] = allowed(window)
                state.allowed = by_window[window]
                # The mask argument is unused: every attention module here calls our function.
                out = layers[index](x, attention_mask=None, **extra)
                record = state.records.pop(index)
                x_in, x = x, out[0] if isinstance(out, tuple) else out
                values = {f.name: getattr(record, f.name) for f in fields(record) if f.name != "outputs"}
                layer = DecoderAttentionLayer(**values, outputs=x, residual=x_in)
                del record, values
                if on_layer is not None:
                    on_layer(index, layer)
                if kept is None or index in kept:
                    trace.layers.append(layer)
                del layer
        finally:
            _ACTIVE.reset(token)
            for hook in hooks:
                hook.remove()
        return ModelOutput(logits=self.head(x, mask), trace=trace)

    def _reads(self, mask: Tensor, prefix: KeyValuePrefix | None) -> tuple[Callable[[int | None], Tensor], Tensor, Tensor]:
        """What the tokens of a pass ``mask`` ``(B,Q)`` read: ``allowed(window)`` ``(B,Q,K)``, the key mask
        ``(B,K)`` and the tokens' position ids ``(B,Q)``; with a :class:`KeyValuePrefix`, its keys first."""
        if prefix is None:
            return partial(causal_allowed, mask), mask, real_positions(mask)
        if prefix.positions is not None:  # rerun positions of a pass whose keys the prefix holds
            at = prefix.positions
            return partial(causal_allowed, prefix.mask, queries=at), prefix.mask, real_positions(prefix.mask).gather(1, at)
        if not self.continues_prefix:
            raise AttnAuditError(f"{self.hf_type} decoder cannot continue from a key/value prefix (no rotary positions, or sliding windows)")
        causal = torch.cat([prefix.mask[:, None, :].expand(-1, mask.shape[1], -1), causal_allowed(mask)], 2)

        def allowed(window: int | None) -> Tensor:
            return causal  # continues_prefix: no sliding window

        return allowed, torch.cat([prefix.mask, mask], 1), real_positions(mask) + prefix.mask.sum(1, keepdim=True)

    def head(self, states: Tensor, mask: Tensor | None = None) -> Tensor:
        """Final norm, then the model's head at each example's last real token (``mask`` None: the last position)."""
        base, hf = self.hf.base_model, self.hf
        final = (base.norm if hasattr(base, "norm") else base.ln_f)(states)
        rows = torch.arange(final.shape[0], device=final.device)
        last = self.explanation_rows(mask) if mask is not None else torch.full_like(rows, final.shape[1] - 1)
        if self.has_head:
            return hf.score(final)[rows, last]  # HF's own order: score every position, then pool
        final = final[rows, last]
        if not hasattr(hf, "lm_head"):
            return final
        if self.verbalizer_ids is None:
            return hf.lm_head(final)
        # only the verbalizer rows of the LM head: the same logits without a (B, vocab) product
        ids = self.verbalizer_ids.to(final.device)
        bias = hf.lm_head.bias[ids] if hf.lm_head.bias is not None else None
        return nn.functional.linear(final, hf.lm_head.weight[ids], bias)

    @property
    def continues_prefix(self) -> bool:
        """Whether :meth:`decode` can continue from a :class:`KeyValuePrefix`: rotary positions
        (computed from position ids, so new tokens can start after the prefix) and no
        sliding-window layer (Llama, Qwen2 without windows; not GPT-2's learned positions)."""
        if getattr(self.hf.base_model, "rotary_emb", None) is None:
            return False
        return all(getattr(m, "sliding_window", None) is None for m in self._attention_modules)

    def prefix_from(self, trace: AttentionTrace, rows: Tensor, lengths: Tensor) -> KeyValuePrefix:
        """The first ``lengths[r]`` tokens of example ``rows[r]`` of a full ``trace`` (all layers,
        no key/value intervention) as a :class:`KeyValuePrefix`, one key/value head per group."""
        if len(trace) != self.num_attention_layers:
            raise AttnAuditError("prefix_from needs the trace of every layer")
        groups = self.config.heads // self.kv_heads
        width = int(lengths.max()) if len(lengths) else 0
        keys = [layer.keys[rows, ::groups, :width] for layer in trace]
        values = [layer.values[rows, ::groups, :width] for layer in trace]
        mask = torch.arange(width, device=lengths.device)[None, :] < lengths[:, None]
        return KeyValuePrefix(keys=keys, values=values, mask=mask)

    def rerun_cache(self, trace: AttentionTrace, layer: int, base: Cache, rows: Tensor) -> Cache:
        """Restart at trace layer ``layer`` at one position per example, ``rows`` ``(B,)``, reading the
        other positions' keys and values from the full ``trace`` (a :class:`KeyValuePrefix` with
        ``positions``): a pass of one token per example. The output equals the full restart's when
        interventions change that position's attention rows only and no real token follows it (the
        last real token, :meth:`explanation_rows`): causally, nothing else changes."""
        if len(trace) != self.num_attention_layers:
            raise AttnAuditError("rerun_cache needs the trace of every layer")
        groups = self.config.heads // self.kv_heads
        entry = trace[layer % len(trace)]
        if getattr(entry, "residual", None) is None:
            raise AttnAuditError("rerun_cache needs a trace from HFDecoderModel.decode")
        at = rows.to(entry.mask.device)[:, None]
        first = layer % len(trace)
        prefix = KeyValuePrefix(  # only the layers rerun (the entries of earlier ones are never read)
            keys=[record.keys[:, ::groups] if i >= first else None for i, record in enumerate(trace)],
            values=[record.values[:, ::groups] if i >= first else None for i, record in enumerate(trace)],
            mask=entry.mask.bool(),
            positions=at,
        )
        states = entry.residual.gather(1, at[:, :, None].expand(-1, -1, entry.residual.shape[-1]))
        return Cache(states=states, mask=torch.ones_like(at, dtype=torch.bool), layer=layer % len(trace),
                     extra={**base.extra, "prefix": prefix})

    def cache_at(self, trace: AttentionTrace, layer: int, base: Cache) -> Cache:
        """Restart at trace layer ``layer`` from the residual stream that entered it."""
        layer = layer % max(len(trace), 1)
        entry = trace[layer]
        residual = getattr(entry, "residual", None)
        if residual is None:
            raise AttnAuditError("cache_at needs a trace from HFDecoderModel.decode")
        return Cache(states=residual, mask=entry.mask, layer=layer, extra=dict(base.extra))


def norm_params(module: nn.Module) -> NormParams:
    """An RMSNorm (``variance_epsilon``, no bias, not centred) or LayerNorm module as :class:`NormParams`."""
    if hasattr(module, "variance_epsilon"):
        return NormParams(weight=module.weight, bias=None, eps=float(module.variance_epsilon), centred=False)
    return NormParams(weight=module.weight, bias=module.bias, eps=float(module.eps))


# -- loading -----------------------------------------------------------------------------------


def _gguf(source: str) -> tuple[str, dict[str, str]]:
    """``(folder, extra from_pretrained kwargs)``: a ``.gguf`` file is loaded from its folder by name."""
    path = Path(source)
    if path.suffix.lower() == ".gguf":
        return str(path.parent), {"gguf_file": path.name}
    return source, {}


@contextlib.contextmanager
def _quiet_gguf() -> Iterator[None]:
    """Hide transformers' GGUF de-quantisation progress bar (a bare tqdm that its logging settings do not reach)."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    bar = gguf_utils.tqdm
    gguf_utils.tqdm = partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = bar


def _load(loader: Any, folder: str, gguf: dict[str, str], **kwargs: Any) -> Any:
    """``loader.from_pretrained``: a folder or hub name through :func:`attnaudit.hf._pretrained`;
    a GGUF file directly (:func:`_load_gguf`; in practice once per file, see
    :mod:`attnaudit.models.gguf_cache`)."""
    if not gguf:
        return _pretrained(loader, folder, **kwargs)
    return _load_gguf(loader, folder, Path(folder) / gguf["gguf_file"], gguf, **kwargs)


def _load_gguf(loader: Any, folder: str, path: Path, gguf: dict[str, str], **kwargs: Any) -> Any:
    """``loader.from_pretrained`` of a GGUF file; a missing package or bad file is one error."""
    try:
        with _quiet_transformers(), _quiet_gguf():
            return loader.from_pretrained(folder, **gguf, **kwargs)
    except ImportError as exc:  # gguf or accelerate missing
        raise AttnAuditError(f"could not load {path}: {str(exc).strip().splitlines()[0]} ({GGUF_INSTALL})") from None
    except (OSError, ValueError, KeyError, IndexError, TypeError, RuntimeError, struct.error) as exc:  # not a (supported) GGUF file
        message = str(exc).strip().splitlines()
        raise InputError(path, f"cannot be loaded as a GGUF model: {message[0] if message else type(exc).__name__}") from None


def _detach_gguf_quantizer(hf: nn.Module) -> None:
    """Forget that a model came from GGUF. Its weights are already de-quantised to float32, but
    transformers keeps the GGUF quantizer attached, and that refuses ``save_pretrained``; without
    it a fine-tuned model saves as plain safetensors (and reloads as an ordinary checkpoint)."""
    hf.hf_quantizer = None
    if hasattr(hf.config, "quantization_config"):
        del hf.config.quantization_config


def _convert_gguf(folder: str, gguf: dict[str, str], out: Path) -> None:
    """De-quantise a GGUF causal LM and its tokenizer into ``out`` as a float32 safetensors folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = _load(AutoModelForCausalLM, folder, gguf, attn_implementation="eager", dtype=torch.float32)
    _detach_gguf_quantizer(hf)
    tokenizer = _load(AutoTokenizer, folder, gguf)
    with _quiet_transformers():
        hf.save_pretrained(out)
        tokenizer.save_pretrained(out)


def build_decoder_model(
    source: str,
    task_type: str,
    num_labels: int | None = None,
    trained_head: bool | None = None,
    has_head: bool = False,
    dtype: torch.dtype = torch.float32,
) -> HFDecoderModel:
    """Load a decoder (a HF folder or hub name: safetensors only; or a ``.gguf`` file) with eager attention.

    ``has_head``: the checkpoint has a sequence-classification head (loaded with it);
    otherwise ``num_labels`` adds a fresh one (for fine-tuning) and None loads the causal LM.
    A GGUF file is dequantised by transformers (needs ``gguf`` and ``accelerate``) once, then read
    from :mod:`attnaudit.models.gguf_cache`. ``dtype``:
    the parameters' dtype (float32, the reference; bfloat16 halves memory, e.g. on a GPU).
    """
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        AutoTokenizer,
    )

    folder, gguf = _gguf(source)
    cached = gguf_cache.converted(Path(folder) / gguf["gguf_file"], partial(_convert_gguf, folder, gguf)) if gguf else None
    if cached is not None:
        folder, gguf = str(cached), {}
    common: dict[str, Any] = {"attn_implementation": "eager", "dtype": dtype}
    if not gguf:
        common["use_safetensors"] = True
    if has_head:
        hf = _load(AutoModelForSequenceClassification, folder, gguf, **common)
    elif num_labels is not None:
        hf = _load(AutoModelForSequenceClassification, folder, gguf, num_labels=num_labels, **common)
    else:
        hf = _load(AutoModelForCausalLM, folder, gguf, **common)
    if gguf:
        _detach_gguf_quantizer(hf)
    tokenizer = _load(AutoTokenizer, folder, gguf)
    if has_head and num_labels is not None and num_labels != hf.config.num_labels:
        raise AttnAuditError(f"{source} has a classification head with {hf.config.num_labels} labels, the task has {num_labels}")
    if not gguf and cached is None:  # the cache holds our own conversion
        _check_weights(source, hf)
    model = HFDecoderModel(hf, tokenizer, task_type, source, has_head if trained_head is None else trained_head)
    hf.config.pad_token_id = tokenizer.pad_token_id  # HF's own sequence-classification pooling needs it
    return model
