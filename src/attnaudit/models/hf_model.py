"""Any Hugging Face transformer behind the one model interface: one adapter, no per-family code.

What a model *is* comes from one dry run (:mod:`attnaudit.models.hf_structure`): its attention
layers in call order, the block each runs in, self or cross, causal or not, and (where a method
needs it) value/output projections and norm layout, each checked against the run. Attention is
captured and changed inside the model's own code (:mod:`attnaudit.models.hf_attention`).

Every pass is the model's own ``forward``: embeddings, positions (rotary, learned, ALiBi,
relative), masks (causal, sliding-window, padding) and the head are the model's. What the
adapter adds is done around the blocks, whose ``forward`` is wrapped for the pass:

* **restart at layer k**: blocks before k's block return their input unchanged (or, where the
  next block reads their other outputs, as T5's position bias, what the recorded pass gave; without
  that record they run), and k's block receives the cached states;
* **records**: each block's input (``residual``) and output (``outputs``) complete the records
  of its attention layers; ``on_layer`` sees each as its block finishes and only ``keep_layers``
  stay in the trace;
* **the decision**: a causal LM's head reads each example's last real token only, a decoder's
  classification head its last real token whatever its padding id, a bare model its
  ``[CLS]`` (encoders) or last real (decoders) state; an encoder-decoder gives ``(B,T_tgt,V)``.

Decoders whose attention reaches the interface keep two fast paths: a rerun of one position per
example reading the other positions' keys and values (:meth:`HFModel.rerun_cache`) and a
continuation after a key/value prefix (:meth:`HFModel.prefix_from`, leave-one-out).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from attnaudit.data.types import Batch
from attnaudit.errors import AttnAuditError
from attnaudit.models import hf_attention
from attnaudit.models.base import (
    AttentionLayer,
    AttentionModel,
    AttentionTrace,
    Cache,
    HeadLayers,
    Intervention,
    ModelConfig,
    ModelOutput,
    ResidualNorms,
    dense,
    interventions_for,
)
from attnaudit.models.hf_attention import ATTN_IMPLEMENTATION, KeyValuePrefix, LayerCall
from attnaudit.models.hf_structure import BlockLayout, Structure, discover, first_tensor, hidden_argument
from attnaudit.models.lrp import RelevanceSites, scan_sites
from attnaudit.models.seq2seq import EncoderDecoderLayout

LayerCallback = Callable[[int, AttentionLayer], None]
WIDTH_NAMES = ("hidden_size", "d_model", "n_embd", "dim")
FFN_NAMES = ("intermediate_size", "ffn_dim", "encoder_ffn_dim", "d_ff", "n_inner", "hidden_dim")
POSITION_NAMES = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")
DROPOUT_NAMES = ("attention_dropout", "attention_probs_dropout_prob", "attn_pdrop", "dropout")
GATES = (("gate_proj", "act_fn", "down_proj"),)
"""Gated feed-forward maps ``down(act(gate(x)) · up(x))`` by the names of gate, activation and consumer (LRP)."""


@dataclass
class HFLayer(AttentionLayer):
    """A traced attention layer of a Hugging Face model: ``residual`` ``(B,T,d)`` the states that
    entered its block; ``allowed`` ``(B,1,Q,K)`` the pairs its queries may read; ``extras`` the block's
    other outputs that the next block reads (T5's position bias), on the block's first layer."""

    residual: Tensor | None = None
    allowed: Tensor | None = None
    extras: tuple[Any, ...] | None = None


class HFInputs(dict):  # type: ignore[type-arg]
    """The keyword arguments of the model's forward for a batch; rows selectable like a cache's extras."""

    def select_rows(self, rows: Tensor) -> HFInputs:
        return HFInputs({k: v.index_select(0, rows) if isinstance(v, Tensor) and v.dim() else v for k, v in self.items()})


class LayerTensors(dict):  # type: ignore[type-arg]
    """Per attention layer, a tensor of the batch (which keys each rerun query reads); rows selectable."""

    def select_rows(self, rows: Tensor) -> LayerTensors:
        return LayerTensors({k: v.index_select(0, rows) for k, v in self.items()})


def real_positions(mask: Tensor) -> Tensor:
    """Position ids ``(B,T)`` counting real tokens only (0 for leading pads)."""
    return (mask.long().cumsum(1) - 1).clamp_min(0)


def causal_allowed(mask: Tensor, window: int | None = None, queries: Tensor | None = None) -> Tensor:
    """``(B,Q,K)``: query ``i`` may read key ``j`` when ``j <= i`` (and ``i - j < window``) and ``j`` is real;
    ``queries`` ``(B,Q)``: the key positions of the queries (default: every position)."""
    index = torch.arange(mask.shape[1], device=mask.device)
    at = index[None, :, None] if queries is None else queries[:, :, None]
    distance = at - index[None, None, :]
    allowed = distance >= 0
    if window is not None:
        allowed = allowed & (distance < window)
    return allowed & mask[:, None, :].bool()


def model_kind(config: Any) -> str:
    """``encoder-decoder``, ``decoder`` (a causal LM family that is not also a masked LM) or ``encoder``."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES

    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder"
    kind = str(getattr(config, "model_type", ""))
    causal = kind in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and kind not in MODEL_FOR_MASKED_LM_MAPPING_NAMES
    return "decoder" if causal or getattr(config, "is_decoder", False) else "encoder"


def _first(config: Any, names: Sequence[str], default: Any = None) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


class _Pass(hf_attention.Capture):
    """One ``decode``: which block call comes next, the records made so far, what each layer gets."""

    def __init__(self, model: HFModel, cache: Cache, start: int, interventions: Sequence[Intervention]) -> None:
        super().__init__(prefix=cache.extra.get("prefix"))
        structure = model.structure
        self.model, self.cache, self.start = model, cache, start
        self.first_block = structure.sites[start].block
        decoder_side = structure.sites[start].side == "decoder"
        self.next_block = structure.sites[model.first_decoder_layer].block if decoder_side else 0
        self.block, self.within = -1, 0
        n = len(structure.sites)
        self.interventions = {layer: interventions_for(interventions, layer, n) for layer in range(n)}
        self.calls: dict[int, LayerCall] = {}
        self.records: dict[int, HFLayer] = {}
        self.masks = model.pass_masks(cache)

    def layer_call(self, layer: int) -> LayerCall | None:
        """The call of attention layer ``layer`` in this pass; None for layers the pass does not run."""
        if layer < self.start:
            return None
        keys, queries, allowed = self.masks(layer)
        return LayerCall(layer=layer, interventions=self.interventions[layer], key_mask=keys, query_mask=queries, allowed=allowed)


class HFModel(EncoderDecoderLayout, AttentionModel):
    """A Hugging Face model (encoder, decoder-only or encoder-decoder; with a classification head,
    an LM head or none) as an :class:`AttentionModel`. ``hf`` is the transformers model."""

    streams_layers = True

    def __init__(self, hf: nn.Module, tokenizer: Any, task_type: str, source: str, trained_head: bool) -> None:
        cfg = hf.config
        if not isinstance(getattr(cfg, "vocab_size", None), int):
            raise AttnAuditError("its config has no vocabulary: not a text transformer (attnaudit explains text models)")
        self.kind = model_kind(cfg)
        if tokenizer.pad_token is None and tokenizer.eos_token is not None:  # GPT-2 has none; pads are masked
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "right"
        has_head = any(hasattr(hf, name) for name in ("score", "classifier")) and self.kind != "encoder-decoder"
        output = self._output_kind(hf, has_head)
        width = int(_first(cfg, WIDTH_NAMES, 0))
        config = ModelConfig(
            model="hf", task_type="seq2seq" if self.kind == "encoder-decoder" else task_type,  # type: ignore[arg-type]
            vocab_size=int(cfg.vocab_size), num_labels=int(cfg.num_labels) if has_head else 0,
            embed_dim=width, hidden_dim=width, attention="softmax", layers=0, heads=0, d_model=width,
            d_ff=int(_first(cfg, FFN_NAMES, 4 * width) or 4 * width),
            dropout=float(_first(cfg, DROPOUT_NAMES, 0.0) or 0.0), max_len=self._max_len(hf, tokenizer),
            pad_id=int(tokenizer.pad_token_id or 0),
            extra={"hf_type": str(cfg.model_type), "source": source, "head": has_head, "trained_head": trained_head, "output": output},
        )
        super().__init__(config)
        self.hf, self.tokenizer, self.hf_type = hf, tokenizer, str(cfg.model_type)
        self.has_head, self.trained_head = has_head, trained_head
        self.verbalizer_ids: Tensor | None = None
        self.uses_token_types = "token_type_ids" in getattr(tokenizer, "model_input_names", ()) and int(getattr(cfg, "type_vocab_size", 0) or 0) > 1
        self.structure = self._discover()
        self._configure()

    # -- construction ---------------------------------------------------------------------------

    @staticmethod
    def _output_kind(hf: nn.Module, has_head: bool) -> str:
        if has_head:
            return "classes"
        if getattr(hf.config, "is_encoder_decoder", False):
            return "translation"
        return "next_token" if hf.get_output_embeddings() is not None else "states"

    @staticmethod
    def _max_len(hf: nn.Module, tokenizer: Any) -> int:
        """The longest input: the model's position table (less RoBERTa's padding offset) and the tokenizer's limit."""
        positions = _first(hf.config, POSITION_NAMES)
        embeddings = getattr(hf.base_model, "embeddings", None)
        offset = int(getattr(embeddings, "padding_idx", -1) or -1) + 1 if hasattr(embeddings, "padding_idx") else 0
        limits = [int(positions) - offset] if isinstance(positions, int) and positions > 0 else []
        tokenizer_limit = int(getattr(tokenizer, "model_max_length", 0) or 0)
        if 0 < tokenizer_limit < 10**7:
            limits.append(tokenizer_limit)
        return min(limits) if limits else 512

    def _discover(self) -> Structure:
        """The dry run, with our attention function where the model takes it (else its eager code stays)."""
        from transformers.utils import logging as hf_logging

        level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # families outside the interface say so; the dry run finds out anyway
        try:
            with contextlib.suppress(ValueError, NotImplementedError, AttributeError, KeyError):
                self.hf.set_attn_implementation(ATTN_IMPLEMENTATION)
        finally:
            hf_logging.set_verbosity(level)
        encoder = self.hf.get_encoder() if self.kind == "encoder-decoder" else None
        was_training = self.hf.training
        self.hf.eval()
        try:
            structure = discover(self.hf, self._inputs(self._dry_batch()), encoder)
        finally:
            self.hf.train(was_training)
        if structure.route == "softmax" and getattr(self.hf.config, "_attn_implementation", "") == ATTN_IMPLEMENTATION:
            self.hf.set_attn_implementation("eager")
        return structure

    def _dry_batch(self) -> Batch:
        """Two short rows of ordinary (non-special) tokens, the second padded; targets of another length."""
        special = set(self.tokenizer.all_special_ids)
        ids = [i for i in range(min(self.config.vocab_size, 1000)) if i not in special][:7]
        tokens = torch.tensor([ids[:7], ids[:5] + [self.config.pad_id] * 2])
        mask = tokens.new_tensor([[1] * 7, [1] * 5 + [0] * 2]).bool()
        batch = Batch(tokens=tokens, mask=mask, examples=[])
        if self.kind == "encoder-decoder":
            start = self.decoder_start
            batch.target = torch.tensor([[start, *ids[:4]], [start, *ids[:2], self.config.pad_id, self.config.pad_id]])
            batch.target_mask = batch.target.new_tensor([[1] * 5, [1] * 3 + [0] * 2]).bool()
        return batch

    def _configure(self) -> None:
        """Config fields and the explained layer from the structure; an encoder-decoder's layer order checked."""
        sites = self.structure.sites
        self.causal = self.structure.causal
        self.self_attention = self.kind != "encoder-decoder"
        heads = self._heads()
        self.kv_heads = int(_first(self.hf.config, ("num_key_value_heads",), heads) or heads)
        if getattr(self.hf.config, "multi_query", False):
            self.kv_heads = 1
        self.config.heads, self.config.layers = heads, len(sites)
        self.config.extra.update(kv_heads=self.kv_heads, route=self.structure.route)
        if self.kind == "decoder":
            self.config.extra["decoder"] = True
        self.explanation_query = 0 if self.kind == "encoder" else None
        self.explained_layer = len(sites) - 1 if self.kind == "encoder-decoder" else -1
        self.first_decoder_layer = next((i for i, s in enumerate(sites) if s.side == "decoder"), 0)
        if self.kind == "encoder-decoder":
            encoder = self.first_decoder_layer
            kinds = [s.kind for s in sites[encoder:]]
            if any(s.side != "encoder" for s in sites[:encoder]) or kinds != ["self", "cross"] * (len(kinds) // 2):
                raise AttnAuditError(f"{self.hf_type}: unexpected order of encoder, decoder and cross-attention layers")
            self.config.layers = encoder
            self.config.extra.update(encoder_decoder=True, decoder_layers=len(kinds) // 2)
        self.value_interventions = self.structure.route == "interface"
        self.supports_lrp = self.structure.route == "interface" and self.kind != "encoder-decoder"

    def _heads(self) -> int:
        return int(_first(self.hf.config, ("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads"), 0) or 0)

    @property
    def decoder_start(self) -> int:
        """An encoder-decoder's decoder start token (its config's; else the pad token, as Marian and T5 use)."""
        start = getattr(self.hf.config, "decoder_start_token_id", None)
        if start is None:
            start = getattr(getattr(self.hf, "generation_config", None), "decoder_start_token_id", None)
        return int(start) if start is not None else self.config.pad_id

    # -- structure ----------------------------------------------------------------------------------

    @property
    def layers(self) -> list[nn.Module]:
        """The distinct block modules, in the order they first run."""
        return list({id(m): m for m in self.structure.blocks}.values())

    @property
    def num_attention_layers(self) -> int:
        return len(self.structure.sites)

    def _layout(self) -> tuple[int, int]:
        encoder = self.first_decoder_layer
        return encoder, (len(self.structure.sites) - encoder) // 2

    @property
    def cross_layers(self) -> list[int]:
        return EncoderDecoderLayout.cross_layers.fget(self) if self.kind == "encoder-decoder" else []  # type: ignore[attr-defined]

    def lacks(self, need: str) -> str | None:
        """Why this model lacks a structural need (:data:`attnaudit.explain.base.NEEDS`), or None."""
        if need == "value_output":
            if self.structure.route != "interface":
                return f"{self.hf_type}: attention is computed inside {type(self.structure.sites[0].module).__name__}, not through the attention interface, so its values are not seen"
            missing = [i for i, s in enumerate(self.structure.sites) if s.projections is None]
            return f"{self.hf_type}: no linear map reproduces the values or takes the output of attention layer {missing[0]}" if missing else None
        if need == "residual_norms":
            reason = self.lacks("value_output") if self.self_attention else f"{self.hf_type} is an encoder-decoder"
            bad = [v for v in self.structure.layouts.values() if not isinstance(v, BlockLayout) or v.kind not in ("pre", "post")]
            if reason is None and bad:
                layout = bad[0]
                reason = f"{self.hf_type}: {layout}" if isinstance(layout, str) else f"{self.hf_type} has {layout.kind} blocks; these methods decompose pre- and post-norm blocks"
            return reason
        if need == "lrp":
            if not self.supports_lrp:
                return f"{self.hf_type}: relevance rules need the attention interface and a single stack" 
            return None
        return super().lacks(need)

    @property
    def has_value_output(self) -> bool:  # type: ignore[override]
        return self.lacks("value_output") is None

    @property
    def has_residual_norms(self) -> bool:  # type: ignore[override]
        return self.lacks("residual_norms") is None

    def value_output_maps(self, layer: int) -> tuple[Tensor, Tensor, Tensor, int]:
        """``(W_V, b_V, W_O, heads)`` per *query* head as right-multiplied maps: a key/value head's columns
        are repeated for every query head that reads it (grouped- and multi-query attention)."""
        reason = self.lacks("value_output")
        if reason:
            raise AttnAuditError(reason)
        site = self.structure.sites[layer % self.num_attention_layers]
        assert site.projections is not None
        w_v, b_v = site.projections.w_v, site.projections.b_v
        heads = self.config.heads
        kv = w_v.shape[1] // max(site.projections.w_o.shape[0] // heads, 1)
        if kv < heads:
            dh, groups = w_v.shape[1] // kv, heads // kv
            w_v = w_v.reshape(-1, kv, dh).repeat_interleave(groups, 1).reshape(w_v.shape[0], heads * dh)
            b_v = b_v.reshape(kv, dh).repeat_interleave(groups, 0).reshape(-1)
        return w_v, b_v, site.projections.w_o, heads

    def attention_projections(self, layer: int) -> tuple[nn.Module, nn.Module]:
        """The module computing attention layer ``layer``'s values (maybe a fused query/key/value map) and its
        output projection."""
        reason = self.lacks("value_output")
        if reason:
            raise AttnAuditError(reason)
        projections = self.structure.sites[layer % self.num_attention_layers].projections
        assert projections is not None
        return projections.modules

    def residual_norms(self, layer: int) -> ResidualNorms:
        """The norms, output bias and feed-forward map around attention layer ``layer`` (pre- or post-norm blocks)."""
        reason = self.lacks("residual_norms")
        if reason:
            raise AttnAuditError(reason)
        site = self.structure.sites[layer % self.num_attention_layers]
        layout = self.structure.layouts[site.block]
        assert isinstance(layout, BlockLayout) and site.projections is not None
        return ResidualNorms(
            placement=layout.kind,  # type: ignore[arg-type]
            attention_norm=layout.attention_norm.params(), ffn_norm=layout.ffn_norm.params(),
            output_bias=site.projections.b_o, ffn=layout.ffn, ffn_layers=layout.ffn_layers,
        )

    def residual_stream(self, record: AttentionLayer) -> Tensor:
        residual = getattr(record, "residual", None)
        if residual is None:
            raise AttnAuditError("residual_stream needs a trace from HFModel.decode")
        return residual

    def relevance_sites(self) -> RelevanceSites:
        """Every norm and activation module of the model, and each gated feed-forward block (:data:`GATES`)."""
        sites = scan_sites(self.hf)
        for gate, act, consumer in GATES:
            for module in self.hf.modules():
                if all(hasattr(module, name) for name in (gate, act, consumer)):
                    sites.gates.append((getattr(module, act), getattr(module, consumer)))
        return sites

    def head_layers(self) -> HeadLayers | None:
        """The classification head as [CLS] pooling + dense layers (BERT's pooler, DistilBERT's pre-classifier,
        RoBERTa's dense + out_proj); None for other heads."""
        hf = self.hf
        if not self.has_head or self.kind != "encoder":
            return None
        classifier = getattr(hf, "classifier", None)
        if hasattr(hf, "pre_classifier"):
            return HeadLayers("first", (dense(hf.pre_classifier, nn.ReLU()), dense(classifier)))
        pooler = getattr(hf.base_model, "pooler", None)
        pooler = getattr(pooler, "dense", pooler)  # BERT's pooler module holds its Linear; ALBERT's is one
        if isinstance(pooler, nn.Linear) and isinstance(classifier, nn.Linear):
            return HeadLayers("first", (dense(pooler, nn.Tanh()), dense(classifier)))
        if isinstance(getattr(classifier, "dense", None), nn.Linear) and isinstance(getattr(classifier, "out_proj", None), nn.Linear):
            return HeadLayers("first", (dense(classifier.dense, nn.Tanh()), dense(classifier.out_proj)))
        return None

    @property
    def special_tokens(self) -> dict[str, str]:
        """Marker tokens the tokenizer adds: ``[CLS]``/``[SEP]`` (encoders), begin/end of sequence (decoders), end and pad."""
        names = {"encoder": ("cls_token", "sep_token"), "decoder": ("bos_token", "eos_token"), "encoder-decoder": ("eos_token", "pad_token")}[self.kind]
        tokens = {name.removesuffix("_token"): getattr(self.tokenizer, name, None) for name in names}
        return {name: str(token) for name, token in tokens.items() if token}

    def wordpieces(self, batch: Batch) -> list[list[str]]:
        """The subword strings on the key axis of each example (real positions only)."""
        return [self.tokenizer.convert_ids_to_tokens(row[m].tolist()) for row, m in zip(batch.tokens, batch.mask.bool())]

    def explanation_rows(self, query_mask: Tensor) -> int | Tensor | None:
        """Decoders: each example's last real token ``(B,)``; encoders: ``[CLS]`` (0); encoder-decoders: the mean."""
        if self.kind != "decoder":
            return self.explanation_query
        index = torch.arange(query_mask.shape[1], device=query_mask.device)
        return (index * query_mask.bool()).argmax(1)

    # -- passes -------------------------------------------------------------------------------------

    def embed(self, batch: Batch) -> Tensor:
        """Token embeddings ``(B,T,d)`` of the input (encoder-decoders: of the source), before positions."""
        ids = batch.tokens
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size):
            raise AttnAuditError(f"token ids must lie in [0, {self.config.vocab_size}); got {int(ids.min())}..{int(ids.max())}")
        return self._embedding()(ids)

    def _embedding(self) -> nn.Module:
        owner = self.hf.get_encoder() if self.kind == "encoder-decoder" else self.hf
        return owner.get_input_embeddings()

    def _inputs(self, batch: Batch) -> HFInputs:
        """The model's forward arguments for ``batch``."""
        inputs = HFInputs(input_ids=batch.tokens, attention_mask=batch.mask.long())
        if self.uses_token_types and batch.features is not None:
            if batch.features.shape != batch.tokens.shape:
                raise AttnAuditError(f"token type ids (batch.features) shape {tuple(batch.features.shape)} differs from tokens {tuple(batch.tokens.shape)}")
            inputs["token_type_ids"] = batch.features
        if self.kind == "decoder" and self._takes("position_ids"):
            inputs["position_ids"] = real_positions(batch.mask)
        if self.kind == "encoder-decoder" and batch.target is not None:
            if batch.target_mask is None:
                raise AttnAuditError("a seq2seq batch with target needs target_mask")
            inputs.update(decoder_input_ids=batch.target, decoder_attention_mask=batch.target_mask.long())
        return inputs

    def _takes(self, name: str) -> bool:
        return name in inspect.signature(self.hf.forward).parameters

    def encode(self, batch: Batch, embeddings: Tensor | None = None) -> Cache:
        """The states entering the first block, by the model's own code (from ``embeddings`` if given)."""
        for ids, what in ((batch.tokens, "source" if self.kind == "encoder-decoder" else "input"), (batch.target, "target")):
            if ids is not None and ids.shape[1] > self.config.max_len:
                raise AttnAuditError(f"{what} sequence of length {ids.shape[1]} exceeds max_len={self.config.max_len}")
        if self.kind == "encoder-decoder" and batch.target is None:
            raise AttnAuditError("an encoder-decoder's forward is teacher-forced: the batch needs a target")
        inputs = self._inputs(batch)
        given = embeddings if embeddings is not None else self.embed(batch)
        states = self._states_entering(inputs, given)
        return Cache(states=states, mask=batch.mask.bool(), layer=0, extra={"inputs": inputs})

    def _states_entering(self, inputs: dict[str, Any], embeddings: Tensor) -> Tensor:
        """Run the model until its first block is called, with ``embeddings`` as the token embeddings."""
        reached: list[Tensor] = []

        def stop(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            hidden = hidden_argument(args, kwargs)
            assert hidden is not None
            reached.append(hidden)
            raise _Reached

        used = [False]

        def replace(_module: nn.Module, _args: tuple[Any, ...], output: Tensor) -> Tensor:
            if used[0]:
                return output
            used[0] = True
            return embeddings

        handles = [self.structure.blocks[0].register_forward_pre_hook(stop, with_kwargs=True), self._embedding().register_forward_hook(replace)]
        try:
            self.hf(**inputs, use_cache=False)
        except _Reached:
            return reached[0]
        finally:
            for handle in handles:
                handle.remove()
        raise AttnAuditError(f"{self.hf_type}: the first block was never called")

    def decode(
        self,
        cache: Cache,
        interventions: Sequence[Intervention] = (),
        start_layer: int | None = None,
        keep_layers: Collection[int] | None = None,
        on_layer: LayerCallback | None = None,
    ) -> ModelOutput:
        """Attention layer ``start_layer`` (default ``cache.layer``) onwards and the head, as the model's own forward.

        ``on_layer(index, record)`` sees each layer's record as its block finishes; the trace keeps only
        ``keep_layers`` (negative: from the end; None: all), so a caller folding layers in holds one at a time."""
        n = self.num_attention_layers
        start = cache.layer if start_layer is None else start_layer
        if not -n <= start < n:
            raise AttnAuditError(f"start_layer {start} out of range for a {n}-layer model")
        start %= n
        block = self.structure.sites[start].block
        if self.structure.layers_of(block)[0] != start:
            name = self.layer_name(start) if self.kind == "encoder-decoder" else str(start)
            first = self.structure.layers_of(block)[0]
            raise AttnAuditError(
                f"cannot restart at attention layer {start} ({name}): it is not the first attention layer of its block; "
                f"restart at layer {first}"
            )
        kept = None if keep_layers is None else {layer % n for layer in keep_layers}
        state = _Pass(self, cache, start, interventions)
        inputs = self._pass_inputs(cache, start)
        trace = AttentionTrace()

        def finished(layer: int, record: HFLayer) -> None:
            if on_layer is not None:
                on_layer(layer, record)
            if kept is None or layer in kept:
                trace.layers.append(record)

        with hf_attention.capturing(state), self._wrapped(state, finished), self._decision(inputs) as decision:
            out = self.hf(**inputs, use_cache=False)
        return ModelOutput(logits=decision(out), trace=trace)

    def _pass_inputs(self, cache: Cache, start: int) -> dict[str, Any]:
        """The forward's arguments for a pass from ``cache``: an encoder-decoder restarting in its decoder
        skips the encoder (its output given); a continuation's tokens take the positions after its prefix."""
        prefix: KeyValuePrefix | None = cache.extra.get("prefix")
        if prefix is not None and prefix.positions is None and not self.continues_prefix:
            raise AttnAuditError(
                f"{self.hf_type} decoder cannot continue from a key/value prefix (positions added before its first block, "
                "sliding windows, or attention outside the interface)"
            )
        inputs = dict(cache.extra.get("inputs") or {})
        if not inputs:
            raise AttnAuditError("this cache was not made by HFModel.encode")
        if self.structure.sites[start].side == "decoder":
            inputs["encoder_outputs"] = (cache.extra["memory"],)
        if prefix is not None and prefix.positions is None:
            inputs["position_ids"] = real_positions(cache.mask) + prefix.mask.sum(1, keepdim=True)
            inputs["attention_mask"] = cache.mask.long()
        return inputs

    def pass_masks(self, cache: Cache) -> Callable[[int], tuple[Tensor, Tensor, Tensor | None]]:
        """``masks(layer) -> (key mask (B,K), query mask (B,Q), allowed (B,1,Q,K) or None)`` for a pass from ``cache``."""
        inputs = cache.extra.get("inputs") or {}
        prefix: KeyValuePrefix | None = cache.extra.get("prefix")
        given: dict[int, Tensor] = cache.extra.get("allowed") or {}
        source = inputs["attention_mask"].bool() if "attention_mask" in inputs else cache.mask.bool()
        target = inputs["decoder_attention_mask"].bool() if "decoder_attention_mask" in inputs else None
        mask = cache.mask.bool()
        if prefix is not None and prefix.positions is None:
            keys = torch.cat([prefix.mask, mask], 1)
            joined = torch.cat([prefix.mask[:, None, :].expand(-1, mask.shape[1], -1), causal_allowed(mask)], 2)[:, None]
        sites = self.structure.sites

        def masks(layer: int) -> tuple[Tensor, Tensor, Tensor | None]:
            site = sites[layer]
            if prefix is not None and prefix.positions is not None:
                return prefix.mask, mask, given[layer]
            if prefix is not None:
                return keys, mask, joined
            if site.side == "decoder":
                assert target is not None
                return (source if site.kind == "cross" else target), target, None
            return source, source, None

        return masks

    @contextlib.contextmanager
    def _wrapped(self, state: _Pass, finished: Callable[[int, HFLayer], None]) -> Iterator[None]:
        """Blocks and attention modules wrapped for one pass (see the module docstring); restored on exit."""
        structure = self.structure
        attention_hooks = []
        for module in {id(s.module): s.module for s in structure.sites}.values():
            attention_hooks.append(module.register_forward_pre_hook(partial_pre(state), with_kwargs=True))
            attention_hooks.append(module.register_forward_hook(partial_post(state), with_kwargs=True))
        saved = {id(m): (m, m.__dict__.get("forward")) for m in structure.blocks}
        for module, old in saved.values():
            plain = old if old is not None else type(module).forward.__get__(module)
            module.forward = _block_forward(state, plain, finished)  # type: ignore[method-assign]
        try:
            yield
        finally:
            for hook in attention_hooks:
                hook.remove()
            for module, old in saved.values():
                if old is None:
                    del module.forward
                else:
                    module.forward = old  # type: ignore[method-assign]

    @contextlib.contextmanager
    def _decision(self, inputs: dict[str, Any]) -> Iterator[Callable[[Any], Tensor]]:
        """How the output becomes logits: each example's decision row only (see the module docstring)."""
        mask = inputs["attention_mask"].bool()
        rows = self.explanation_rows(mask)
        handles = []
        if self.config.extra["output"] in ("next_token", "verbalizer") and isinstance(rows, Tensor):
            def gather(_module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
                hidden = args[0]
                return (hidden[torch.arange(hidden.shape[0], device=hidden.device), rows.to(hidden.device)][:, None], *args[1:])

            handles.append(self.hf.get_output_embeddings().register_forward_pre_hook(gather))
        elif self.has_head and self.kind == "decoder" and isinstance(rows, Tensor):
            def spread(_module: nn.Module, _args: tuple[Any, ...], out: Tensor) -> Tensor:
                picked = out[torch.arange(out.shape[0], device=out.device), rows.to(out.device)]
                return picked[:, None].expand_as(out)  # whichever position the model pools, it reads our row

            handles.append(self.hf.score.register_forward_hook(spread))

        def decision(out: Any) -> Tensor:
            if self.kind == "encoder-decoder" or self.has_head:
                return out.logits
            if self.config.extra["output"] in ("next_token", "verbalizer"):
                logits = out.logits[:, 0]
                return logits if self.verbalizer_ids is None else logits[:, self.verbalizer_ids.to(logits.device)]
            states = out.last_hidden_state
            if isinstance(rows, Tensor):
                return states[torch.arange(states.shape[0], device=states.device), rows.to(states.device)]
            return states[:, 0]

        try:
            yield decision
        finally:
            for handle in handles:
                handle.remove()

    # -- restarts -------------------------------------------------------------------------------------

    def cache_at(self, trace: AttentionTrace, layer: int, base: Cache) -> Cache:
        """Restart at attention layer ``layer`` of a full ``trace`` from the states that entered its block
        (an encoder-decoder's decoder layer: with the encoder output its cross-attention read)."""
        n = self.num_attention_layers
        layer %= n
        if len(trace) != n:
            raise AttnAuditError("cache_at needs the full trace of a forward pass")
        entry = trace[layer]
        residual = getattr(entry, "residual", None)
        if residual is None:
            first = self.structure.layers_of(self.structure.sites[layer].block)[0]
            raise AttnAuditError(f"cannot restart at attention layer {layer}: it is not the first attention layer of its block; restart at layer {first}")
        extra = {**base.extra, "extras": self._extras(trace)}
        mask = entry.mask
        if self.structure.sites[layer].side == "decoder":
            cross = trace[layer + 1]
            extra["memory"] = cross.inputs
            mask = entry.query_mask if entry.query_mask is not None else entry.mask
        return Cache(states=residual, mask=mask, layer=layer, extra=extra)

    def _extras(self, trace: AttentionTrace) -> dict[int, tuple[Any, ...]]:
        """Per block call, the other outputs the next block reads, from the records of a full trace."""
        found = {}
        for index, record in enumerate(trace.layers):
            extras = getattr(record, "extras", None)
            if extras is not None:
                found[self.structure.sites[index].block] = extras
        return found

    @property
    def rerun_ready(self) -> bool:
        """Whether one position per example can be rerun over the others' keys and values."""
        return self.kind == "decoder" and self.causal and self.structure.route == "interface" and self._takes("position_ids")

    def rerun_cache(self, trace: AttentionTrace, layer: int, base: Cache, rows: Tensor) -> Cache | None:
        """Restart at trace layer ``layer`` at one position per example, ``rows`` ``(B,)``, reading the other
        positions' keys and values from the full ``trace``: a pass of one token per example. The output equals
        the full restart's when interventions change that position's rows only and no real token follows it."""
        if not self.rerun_ready:
            return None
        n = self.num_attention_layers
        if len(trace) != n:
            raise AttnAuditError("rerun_cache needs the trace of every layer")
        first = layer % n
        entry = trace[first]
        if getattr(entry, "residual", None) is None or any(getattr(r, "allowed", None) is None for r in trace.layers[first:]):
            return None
        groups = self.config.heads // self.kv_heads
        at = rows.to(entry.mask.device)[:, None]
        prefix = KeyValuePrefix(
            keys=[r.keys[:, ::groups] if i >= first and r.keys is not None else None for i, r in enumerate(trace)],
            values=[r.values[:, ::groups] if i >= first and r.values is not None else None for i, r in enumerate(trace)],
            mask=entry.mask.bool(), positions=at,
        )
        pick = torch.arange(len(at), device=at.device)
        allowed = LayerTensors({i: trace[i].allowed[pick, :, rows][:, :, None] for i in range(first, n)})  # type: ignore[index]
        inputs: HFInputs = base.extra["inputs"]
        ids = inputs["input_ids"].gather(1, at)
        states = entry.residual.gather(1, at[:, :, None].expand(-1, -1, entry.residual.shape[-1]))  # type: ignore[union-attr]
        positions = real_positions(entry.mask).gather(1, at)
        rerun = HFInputs(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=positions)
        return Cache(states=states, mask=torch.ones_like(at, dtype=torch.bool), layer=first,
                     extra={**base.extra, "inputs": rerun, "prefix": prefix, "allowed": allowed})

    @property
    def continues_prefix(self) -> bool:
        """Whether :meth:`decode` can continue after a :class:`KeyValuePrefix`: a causal decoder on the
        interface route whose windows (if any) are longer than its inputs and whose first block's input
        does not depend on positions (rotary positions are applied in attention, so new tokens can follow)."""
        if not self.rerun_ready:
            return False
        cfg = self.hf.config
        kinds = set(getattr(cfg, "layer_types", None) or ["full_attention"])
        window = getattr(cfg, "sliding_window", None) if getattr(cfg, "use_sliding_window", True) else None
        if (kinds != {"full_attention"} or window is not None) and (window is None or window < self.config.max_len):
            return False
        if getattr(cfg, "attention_chunk_size", None):
            return False
        return self._position_free

    @property
    def _position_free(self) -> bool:
        cached = self.__dict__.get("_position_free_value")
        if cached is None:
            batch = self._dry_batch()
            with torch.no_grad():
                inputs = self._inputs(batch)
                plain = self._states_entering(inputs, self.embed(batch))
                inputs["position_ids"] = inputs["position_ids"] + 3
                moved = self._states_entering(inputs, self.embed(batch))
            cached = bool(torch.equal(plain, moved))
            self.__dict__["_position_free_value"] = cached
        return cached

    def prefix_from(self, trace: AttentionTrace, rows: Tensor, lengths: Tensor) -> KeyValuePrefix:
        """The first ``lengths[r]`` tokens of example ``rows[r]`` of a full ``trace`` (all layers, no key/value
        intervention) as a :class:`KeyValuePrefix`, one key/value head per group."""
        if len(trace) != self.num_attention_layers:
            raise AttnAuditError("prefix_from needs the trace of every layer")
        groups = self.config.heads // self.kv_heads
        width = int(lengths.max()) if len(lengths) else 0
        keys = [layer.keys[rows, ::groups, :width] for layer in trace]  # type: ignore[index]
        values = [layer.values[rows, ::groups, :width] for layer in trace]  # type: ignore[index]
        mask = torch.arange(width, device=lengths.device)[None, :] < lengths[:, None]
        return KeyValuePrefix(keys=keys, values=values, mask=mask)

    @torch.no_grad()
    def greedy(self, batch: Batch, max_len_a: float = 1.5, max_len_b: int = 10) -> list[list[int]]:
        """An encoder-decoder's greedy translation with the model's ``generate`` (one beam): target ids per
        example without the start token, ``</s>`` or padding; at most ``max_len_a * source_length + max_len_b`` steps."""
        was_training = self.training
        self.eval()
        steps = min(int(max_len_a * int(batch.mask.sum(1).max()) + max_len_b), self.config.max_len - 1)
        out = self.hf.generate(input_ids=batch.tokens, attention_mask=batch.mask.long(), do_sample=False, num_beams=1,
                               max_new_tokens=steps, decoder_start_token_id=self.decoder_start)
        self.train(was_training)
        eos, specials = self.tokenizer.eos_token_id, set(self.tokenizer.all_special_ids)
        result = []
        for row in out[:, 1:].tolist():
            row = row[: row.index(eos)] if eos in row else row
            result.append([i for i in row if i not in specials])
        return result


class _Reached(Exception):
    """Raised by a pre-hook on the first block: the states entering it were read."""


def partial_pre(state: _Pass) -> Callable[..., None]:
    """The pre-hook of an attention module in a pass: which layer runs, its inputs, the softmax armed."""

    def pre(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        layers = state.model.structure.layers_of(state.block)
        layer = layers[state.within] if state.within < len(layers) else None
        state.within += 1
        call = None if layer is None or state.block < state.first_block else state.layer_call(layer)
        if call is None:
            return
        memory = next((kwargs[n] for n in ("key_value_states", "encoder_hidden_states") if isinstance(kwargs.get(n), Tensor)), None)
        call.inputs = memory if memory is not None else hidden_argument(args, kwargs)
        state.calls[layer] = call  # type: ignore[index]
        state.running, state.armed = call, call

    return pre


def partial_post(state: _Pass) -> Callable[..., None]:
    """The post-hook of an attention module in a pass: the softmax disarmed."""

    def post(_module: nn.Module, _args: tuple[Any, ...], _kwargs: dict[str, Any], _out: Any) -> None:
        state.running, state.armed = None, None

    return post


def _block_forward(state: _Pass, plain: Callable[..., Any], finished: Callable[[int, HFLayer], None]) -> Callable[..., Any]:
    """A block's ``forward`` within a pass: skipped before the restart, fed the cached states at it, recorded after."""
    structure = state.model.structure

    def forward(*args: Any, **kwargs: Any) -> Any:
        number = state.next_block
        state.next_block += 1
        hidden = hidden_argument(args, kwargs)
        if number < state.first_block:
            replay = _replay(structure, state, number, hidden)
            if replay is not None:
                return replay
        elif number == state.first_block:
            args, kwargs = _with_hidden(args, kwargs, state.cache.states)
            hidden = state.cache.states
        state.block, state.within = number, 0
        out = plain(*args, **kwargs)
        if number >= state.first_block:
            _finish_block(state, number, hidden, out, finished)
        return out

    return forward


def _replay(structure: Structure, state: _Pass, number: int, hidden: Tensor | None) -> Any:
    """What a skipped block returns: its input (and the other outputs the next block reads, recorded); None: run it."""
    size = structure.tuple_outputs[number]
    if not size:
        return hidden
    extras = (state.cache.extra.get("extras") or {}).get(number)
    if structure.passes_state[number] and extras is None:
        return None
    return (hidden, *(extras if extras is not None else (None,) * (size - 1)))


def _with_hidden(args: tuple[Any, ...], kwargs: dict[str, Any], states: Tensor) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A block call's arguments with its hidden states replaced."""
    if args and isinstance(args[0], Tensor):
        return (states, *args[1:]), kwargs
    for name in ("hidden_states", "hidden_state", "x", "input", "hidden"):
        if name in kwargs:
            return args, {**kwargs, name: states}
    raise AttnAuditError("cannot find the hidden states among a block's arguments")


def _finish_block(state: _Pass, number: int, hidden: Tensor | None, out: Any, finished: Callable[[int, HFLayer], None]) -> None:
    """Complete the records of a block's attention layers (input, output, extras) and hand them over."""
    structure = state.model.structure
    layers = structure.layers_of(number)
    output = first_tensor(out)
    extras = tuple(out[1:]) if structure.passes_state[number] and isinstance(out, tuple) else None
    for position, layer in enumerate(layers):
        call = state.calls.pop(layer, None)
        if call is None or call.weights is None:
            raise AttnAuditError(f"{state.model.hf_type}: attention layer {layer} did not reach the attention softmax")
        record = HFLayer(
            weights=call.weights, mask=call.key_mask if call.key_mask is not None else call.allowed.any(2).any(1),  # type: ignore[union-attr]
            inputs=call.inputs if call.inputs is not None else call.weights.new_empty(0), keys=call.keys, values=call.values,
            scores=call.scores, query_mask=call.query_mask, name=state.model.layer_label(layer),
            outputs=output if position == len(layers) - 1 else None,
            residual=hidden if position == 0 else None, allowed=call.allowed,
            extras=extras if position == 0 else None,
        )
        finished(layer, record)


def _label(model: HFModel, layer: int) -> str:
    return model.layer_name(layer) if model.kind == "encoder-decoder" else f"layer{layer}"


HFModel.layer_label = _label  # type: ignore[attr-defined]
