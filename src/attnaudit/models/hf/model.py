"""Any Hugging Face transformer behind the one model interface: one adapter, no per-family code.

What a model *is* comes from one dry run (:mod:`attnaudit.models.hf.structure`): its attention
layers in call order, the block each runs in, self or cross, causal or not, and (where a method
needs it) value/output projections and norm layout, each checked against the run. Attention is
captured and changed inside the model's own code (:mod:`attnaudit.models.hf.attention`).

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
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from attnaudit.data.types import Batch
from attnaudit.errors import AttnAuditError
from attnaudit.models.hf import attention as hf_attention
from attnaudit.models.hf.attention import ATTN_IMPLEMENTATION
from attnaudit.models.hf.capabilities import HFCapabilities
from attnaudit.models.hf.config import (
    DROPOUT_NAMES,
    FFN_NAMES,
    WIDTH_NAMES,
    decoder_start,
    first_of,
    max_length,
    model_kind,
    output_kind,
)
from attnaudit.models.hf.config import heads as attention_heads
from attnaudit.models.hf.generation import Step as GenerationStep
from attnaudit.models.hf.generation import continue_ids, forced_distributions, generation_trace, input_device
from attnaudit.models.hf.inputs import HFInputs, pass_inputs, pass_masks, real_positions, states_entering
from attnaudit.models.hf.layouts import read_layouts
from attnaudit.models.hf.memory import release_freed_memory
from attnaudit.models.hf.passes import CHECKPOINT_TOKENS, HFLayer, Pass, decided, given_output, wrapped
from attnaudit.models.hf.projections import read_projections
from attnaudit.models.hf.readout import Cut, find_cut, read_rows_only
from attnaudit.models.hf.restarts import HFRestarts
from attnaudit.models.hf.structure import Structure, discover
from attnaudit.models.interface import (
    AttentionLayer,
    AttentionTrace,
    Cache,
    Intervention,
    LanguageModel,
    ModelConfig,
    ModelOutput,
    evaluation,
)
from attnaudit.models.lrp import active_rule
from attnaudit.models.seq2seq import EncoderDecoderLayout

if TYPE_CHECKING:
    from transformers import PreTrainedModel

LayerCallback = Callable[[int, AttentionLayer], None]
class HFModel(HFCapabilities, HFRestarts, EncoderDecoderLayout, LanguageModel):
    """A Hugging Face model (encoder, decoder-only or encoder-decoder; with a classification head,
    an LM head or none) as a :class:`~attnaudit.models.interface.LanguageModel`. ``hf`` is the transformers model."""

    streams_layers = True
    keep_scores = False
    """Traces hold each layer's pre-softmax scores as well (for checks; they double a trace's memory)."""
    target_items = False
    """An encoder-decoder's explained items include its decoder inputs (:meth:`attnaudit.models.interface.LanguageModel.target_side`)."""

    def __init__(self, hf: PreTrainedModel, tokenizer: Any, task_type: str, source: str, trained_head: bool) -> None:
        cfg = hf.config
        if not isinstance(getattr(cfg, "vocab_size", None), int):
            raise AttnAuditError("its config has no vocabulary: not a text transformer (attnaudit explains text models)")
        self.kind = model_kind(cfg)
        if tokenizer.pad_token is None and tokenizer.eos_token is not None:  # GPT-2 has none; pads are masked
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "right"
        has_head = any(hasattr(hf, name) for name in ("score", "classifier")) and self.kind != "encoder-decoder"
        output = output_kind(hf, has_head)
        width = int(first_of(cfg, WIDTH_NAMES, 0))
        num_labels = cfg.num_labels if has_head else 0
        assert num_labels is not None  # a classification head's config has its labels (id2label)
        config = ModelConfig(
            model="hf", task_type="seq2seq" if self.kind == "encoder-decoder" else task_type,  # type: ignore[arg-type]
            vocab_size=int(cfg.vocab_size), num_labels=int(num_labels),
            embed_dim=width, hidden_dim=width, attention="softmax", layers=0, heads=0, d_model=width,
            d_ff=int(first_of(cfg, FFN_NAMES, 4 * width) or 4 * width),
            dropout=float(first_of(cfg, DROPOUT_NAMES, 0.0) or 0.0), max_len=max_length(hf, tokenizer),
            pad_id=int(tokenizer.pad_token_id or 0),
            extra={"hf_type": str(cfg.model_type), "source": source, "head": has_head, "trained_head": trained_head, "output": output},
        )
        super().__init__(config)
        self.hf, self.tokenizer, self.hf_type = hf, tokenizer, str(cfg.model_type)
        self.has_head, self.trained_head = has_head, trained_head
        self.verbalizer_ids: Tensor | None = None
        self._shift_invariant: bool | None = None
        self._cuts: list[Cut | None] = []  # the read-rows cut once found (:meth:`logits_forward`); empty: not looked for
        self._generated: tuple[list[int], list[int], list[GenerationStep]] | None = None  # the last continuation's rows (keep_rows)
        self.uses_token_types = "token_type_ids" in getattr(tokenizer, "model_input_names", ()) and int(getattr(cfg, "type_vocab_size", 0) or 0) > 1
        self.structure = self._discover()
        self._configure()

    # -- construction ---------------------------------------------------------------------------

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
            structure, run = discover(self.hf, self._inputs(self._dry_batch()), encoder)
            read_projections(structure, run)
            if encoder is None:
                read_layouts(structure, run)
        finally:
            self.hf.train(was_training)
        if structure.route == "softmax" and getattr(self.hf.config, "_attn_implementation", "") == ATTN_IMPLEMENTATION:
            self.hf.set_attn_implementation("eager")
        return structure

    def embeddings_shift_invariant(self) -> bool:
        """Found by running the model (once, then remembered): its dry batch with every input embedding shifted by
        the embeddings' mean magnitude in every dimension gives the same logits (a LayerNorm reads them first, as in
        BERT's family) or not (a residual stream, a scaled embedding, ...)."""
        if self._shift_invariant is None:
            batch = self._dry_batch().to(self.input_device)
            with evaluation(self), torch.no_grad():
                embeddings = self.embed(batch)
                before = self(batch, embeddings=embeddings).logits.float()
                after = self(batch, embeddings=embeddings + embeddings.abs().mean()).logits.float()
            tolerance = 1e-4 if embeddings.dtype in (torch.float32, torch.float64) else 5e-2  # half precision rounds the norm's input coarsely
            self._shift_invariant = bool((after - before).abs().max() <= tolerance * (1.0 + before.abs().max()))
        return self._shift_invariant

    def _dry_batch(self) -> Batch:
        """Two short rows of ordinary (non-special) tokens, the second padded; targets of another length."""
        special = set(self.tokenizer.all_special_ids)
        ordinary = [i for i in range(min(self.config.vocab_size, 1000)) if i not in special] or [self.config.pad_id]
        ids = (ordinary * 7)[:7]  # a vocabulary of fewer than 7 ordinary tokens repeats them
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
        heads = attention_heads(self.hf.config)
        self.kv_heads = int(first_of(self.hf.config, ("num_key_value_heads",), heads) or heads)
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

    @property
    def offloaded(self) -> list[str]:
        """Parameters accelerate keeps off the model between passes (``--device-map`` offloading to the CPU or disk)."""
        return [name for name, p in self.hf.named_parameters() if p.device.type == "meta"]

    @property
    def input_device(self) -> torch.device:
        """Where a batch goes: the input embeddings' device (accelerate moves each layer's inputs to its own)."""
        return input_device(self.hf)

    @property
    def decoder_start(self) -> int:
        """An encoder-decoder's decoder start token (its config's; else the pad token, as Marian and T5 use)."""
        return decoder_start(self.hf, self.config.pad_id)

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

    def layer_label(self, layer: int) -> str:
        """A trace layer's name: ``layer{l}``; an encoder-decoder's ``enc{l}``, ``self{l}``, ``cross{l}``."""
        return self.layer_name(layer) if self.kind == "encoder-decoder" else f"layer{layer}"

    def explanation_rows(self, query_mask: Tensor) -> int | Tensor | None:
        """Decoders: each example's last real token ``(B,)``; encoders: ``[CLS]`` (0); encoder-decoders: the mean, or
        in :meth:`forced_decision` the last target position (-1), each row's last real one ``(B,)`` where ``query_mask``
        (then the decoder's: the explained layer's queries) pads rows of different lengths (the steps of a sequence in one batch)."""
        forced_padded = self.kind == "encoder-decoder" and self.explanation_query == -1 and not bool(query_mask.all())
        if self.kind != "decoder" and not forced_padded:
            return self.explanation_query  # [CLS]; an encoder-decoder's forced target: its last position (-1)
        index = torch.arange(query_mask.shape[1], device=query_mask.device)
        return (index * query_mask.bool()).argmax(1)

    # -- passes -------------------------------------------------------------------------------------

    def embed(self, batch: Batch) -> Tensor:
        """Token embeddings ``(B,T,d)`` of the input (encoder-decoders: of the source), before positions."""
        ids = batch.tokens
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size):
            raise AttnAuditError(f"token ids must lie in [0, {self.config.vocab_size}); got {int(ids.min())}..{int(ids.max())}")
        source = self._embedding()(ids)
        if not self.target_items or batch.target is None:
            return source
        return torch.cat([source, self._decoder_embedding()(batch.target)], 1)

    def _decoder_embedding(self) -> nn.Module:
        return self.hf.get_decoder().get_input_embeddings()

    def _embedding(self) -> nn.Module:
        owner = self.hf.get_encoder() if self.kind == "encoder-decoder" else self.hf
        return owner.get_input_embeddings()

    def _inputs(self, batch: Batch) -> HFInputs:
        """The model's forward arguments for ``batch``."""
        inputs = HFInputs(input_ids=batch.tokens, attention_mask=batch.mask.long())
        if self.uses_token_types and batch.features is not None:
            if batch.features.shape != batch.tokens.shape:
                raise AttnAuditError(
                    f"token type ids (batch.features) shape {tuple(batch.features.shape)} differs from tokens {tuple(batch.tokens.shape)}"
                )
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
        if batch.tokens.shape[-1] >= CHECKPOINT_TOKENS:  # a long pass: what earlier passes freed goes back first
            release_freed_memory()
        inputs = self._inputs(batch)
        given = embeddings if embeddings is not None else self.embed(batch)
        extra: dict[str, Any] = {"inputs": inputs}
        if self.target_items and batch.target is not None:  # the decoder's input embeddings ride after the source's
            given, extra["target_embeddings"] = given[:, : batch.tokens.shape[1]], given[:, batch.tokens.shape[1] :]
        states = states_entering(self.hf, self.structure.blocks[0], self._embedding(), inputs, given)
        return Cache(states=states, mask=batch.mask.bool(), layer=0, extra=extra)

    def decode(
        self,
        cache: Cache,
        interventions: Sequence[Intervention] = (),
        start_layer: int | None = None,
        keep_layers: Collection[int] | None = None,
        on_layer: LayerCallback | None = None,
        rows_only: bool = False,
        cut: Cut | None = None,
        lean: bool = False,
        rows: Tensor | None = None,
    ) -> ModelOutput:
        """Attention layer ``start_layer`` (default ``cache.layer``) onwards and the head, as the model's own forward.

        ``on_layer(index, record)`` sees each layer's record as its block finishes; the trace keeps only
        ``keep_layers`` (negative: from the end; None: all), so a caller folding layers in holds one at a time.
        ``rows_only``: the caller reads the weights at :meth:`explanation_rows` alone, so the layers that can run
        SDPA for their outputs and compute only those rows' weights (:func:`~attnaudit.models.hf.attention._rows_only`;
        not encoder-decoders, interventions or a restart from a key/value prefix). ``cut``: the last block's tail runs at
        the explanation rows alone (:mod:`attnaudit.models.hf.readout`; the last layer's record then holds those rows).
        ``lean``: only the logits (or their gradient) are read: no trace, SDPA where a layer can, long passes recomputed
        block by block in the backward pass (:attr:`~attnaudit.models.hf.attention.Capture.lean`). ``rows`` (with
        ``rows_only`` or ``lean``, a causal decoder): the read rows ``(R,)`` of the one sequence ``cache`` holds, each an instance of the
        output (:meth:`rows_forward` of prefixes); for a ``lean`` pass also ``(B, R)``, R rows of each example, the output
        ``(B·R, C)`` (:meth:`rows_logits`)."""
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
        decoder_side = self.structure.sites[start].side == "decoder"
        first_call = self.structure.sites[self.first_decoder_layer].block if decoder_side else 0
        state = Pass(self.structure, cache, start, interventions, pass_masks(self.structure, cache), self.layer_label, first_call, self.hf_type)
        state.keep_scores = self.keep_scores
        state.lean = lean and on_layer is None and keep_layers is not None and not keep_layers
        state.recompute = self.kind != "encoder-decoder"
        inputs = pass_inputs(self.structure, cache, start, lambda: self.continues_prefix, self.hf_type)
        trace = AttentionTrace()

        def finished(layer: int, record: HFLayer) -> None:
            if on_layer is not None:
                on_layer(layer, record)
            if kept is None or layer in kept:
                trace.layers.append(record)

        one = rows is not None and (len(cache.mask) == 1 or (lean and not rows_only and rows.dim() == 2))
        if rows is not None and not ((rows_only or lean) and self.kind == "decoder" and self.causal and one and cut is None):
            raise AttnAuditError("read rows are given for one sequence of a causal decoder (or (B, R) rows of a lean pass), "
                                 "with rows_only or lean and no cut")
        queries = inputs.get("decoder_attention_mask", inputs["attention_mask"])  # the explained layer's queries
        explained: int | Tensor | None = self.explanation_rows(queries.bool()) if rows is None else rows
        read = explained if explained is None or isinstance(explained, Tensor) else torch.full_like(cache.mask[:, 0], explained, dtype=torch.long)
        if rows_only and self.kind != "encoder-decoder" and read is not None and not interventions:
            state.rows = read
        if cut is not None and (read is None or self.kind == "encoder-decoder"):
            raise AttnAuditError("the read-rows cut needs one read row per example (encoders, decoders)")
        with (
            read_rows_only(cut, read),
            given_output(self._decoder_embedding(), inputs.get("decoder_input_ids"), cache.extra.get("target_embeddings")),
            hf_attention.capturing(state),
            wrapped(state, finished),
            decided(self.hf, self.kind, self.has_head, self.config.extra["output"], self.verbalizer_ids, explained) as decision,
        ):
            out = self.hf(**inputs, use_cache=False)
        return ModelOutput(logits=decision(out), trace=trace)

    def logits_forward(
        self, batch: Batch, interventions: Sequence[Intervention] = (), embeddings: Tensor | None = None
    ) -> ModelOutput:
        """``self(batch, interventions, embeddings)`` read for its logits alone: no trace, and the last block's tail at
        the read rows only where the dry batch gave the same logits that way (:mod:`attnaudit.models.hf.readout`)."""
        return self.decode(self.encode(batch, embeddings), interventions, keep_layers=(), cut=self.read_cut(), lean=True)

    def read_cut(self) -> Cut | None:
        """The last block's read-rows cut (:func:`~attnaudit.models.hf.readout.find_cut` on the dry batch, once), or None."""
        if not self._cuts:
            self._cuts.append(None)
            if self.kind != "encoder-decoder":
                batch = self._dry_batch().to(self.input_device)

                def run(cut: Cut | None) -> Tensor:
                    with evaluation(self), torch.no_grad():
                        return self.decode(self.encode(batch), keep_layers=(), cut=cut).logits.float()

                self._cuts[0] = find_cut(self.structure.blocks, self.structure.sites[-1].module, run)
        return self._cuts[0]

    def rows_forward(self, batch: Batch) -> ModelOutput:
        """``self(batch)`` with each layer's weights at the explanation rows alone where a layer can (``decode(rows_only=True)``);
        such a layer's record keeps no ``(B,T,d)`` states (its ``inputs`` are empty, its ``outputs`` and ``residual`` None).

        A causal decoder's batch whose rows are prefixes of its longest (the steps of a generated sequence) runs that row
        alone and reads each row's explanation row in it: a causal position sees only the tokens before it, so its
        weights and logits are the prefix's own; the trace's weights and the logits have one instance per row (its other
        records, of the one sequence, are not per row)."""
        generated = self._generated_rows(batch)
        if generated is not None:
            return generated
        longest = self._longest_of_prefixes(batch)
        if longest is None:
            return self.decode(self.encode(batch), rows_only=True)
        rows = self.explanation_rows(batch.mask.bool())
        assert isinstance(rows, Tensor)
        out = self.decode(self.encode(batch.select(longest)), rows_only=True, rows=rows)
        if all(record.weights is None or record.weights.shape[0] == len(batch) for record in out.trace):
            return out
        # A layer that cannot read given rows (its weights of the one sequence, not one per row): every row is run.
        return self.decode(self.encode(batch), rows_only=True)

    def prefix_gradient_forward(self, batch: Batch, embeddings: Tensor | None = None) -> tuple[Tensor, Tensor, ModelOutput] | None:
        """:meth:`AttentionModel.prefix_gradient_forward`: a causal decoder's prefixes, run as their longest row in one
        lean pass (SDPA, no trace) read at each row's last real token; call it with gradients enabled."""
        # not under LRP's rules (their backward functions are not batched) nor where blocks are recomputed
        if active_rule() is not None or not torch.is_grad_enabled() or batch.tokens.shape[-1] >= CHECKPOINT_TOKENS:
            return None
        longest = self._longest_of_prefixes(batch)
        if longest is None:
            return None
        one = batch.select(longest)
        rows = self.explanation_rows(batch.mask.bool())
        assert isinstance(rows, Tensor)
        leaf = (self.embed(one) if embeddings is None else embeddings).detach().requires_grad_(True)
        return leaf, rows, self.decode(self.encode(one, leaf), keep_layers=(), lean=True, rows=rows)

    def _longest_of_prefixes(self, batch: Batch) -> Tensor | None:
        """``(1,)`` the index of ``batch``'s longest row when every row is a right-padded prefix of it (a causal decoder's
        plain token rows), else None."""
        if self.kind != "decoder" or not self.causal or len(batch) < 2 or batch.tokens.dim() != 2:
            return None
        if any(getattr(batch, name, None) is not None for name in ("features", "query", "target")):
            return None
        mask = batch.mask.bool()
        lengths = mask.sum(1)
        longest = int(lengths.argmax())
        positions = torch.arange(mask.shape[1], device=mask.device)
        prefixes = bool((mask == (positions < lengths[:, None])).all()) and bool(mask[longest].all())
        if not prefixes or not bool(((batch.tokens == batch.tokens[longest]) | ~mask).all()):
            return None
        return torch.tensor([longest])

    def continuation(
        self, source: Sequence[int], count: int, sample: bool = False, seed: int = 0, keep_rows: bool = False
    ) -> tuple[list[int], Tensor]:
        """Up to ``count`` tokens after ``source`` by the model's own cached forward (greedy, or sampled with a
        generator seeded by ``seed``) and the distribution ``(steps, V)`` each came from; stops after end-of-sequence.

        ``keep_rows``: the generation's own attention rows are kept (a causal decoder whose every layer attends to every
        earlier token), until the next continuation, so that :meth:`rows_forward` of the steps' batch reads them instead
        of running the sequence again."""
        generator = torch.Generator().manual_seed(seed) if sample else None
        encoder_decoder = self.kind == "encoder-decoder"
        start = self.decoder_start if encoder_decoder else -1  # a decoder's prompt is its own start
        eligible = keep_rows and self.structure.route == "interface" and (encoder_decoder or self._full_attention)
        steps: list[GenerationStep] | None = [] if eligible else None
        self._generated = None
        with evaluation(self):
            ids, probs = continue_ids(self.hf, encoder_decoder, source, start, count, self.tokenizer.eos_token_id, sample, generator, steps)
        if steps and len(steps) == len(ids) and all(len(step.weights) == self.num_attention_layers for step in steps):
            self._generated = (list(source), ids, steps)
        return ids, probs

    def _generated_rows(self, batch: Batch) -> ModelOutput | None:
        """:meth:`rows_forward` of the last :meth:`continuation`'s steps from the rows it kept, read for the next token
        without gradients: a decoder's batch of prefixes of the longest (the whole generated sequence but its last token);
        an encoder-decoder's batch of every step (:func:`~attnaudit.explain.generation.step_batches` ``together``)."""
        if self._generated is None or torch.is_grad_enabled() or self.config.extra.get("output") != "next_token" or self.verbalizer_ids is not None:
            return None
        source, ids, steps = self._generated
        ours = self._steps_of if self.kind == "encoder-decoder" else self._prefixes_of
        if len(batch) != len(steps) or not ours(batch, source, ids):
            return None
        labels = [self.layer_label(layer) for layer in range(self.num_attention_layers)]
        logits, trace = generation_trace(steps, labels, self.first_decoder_layer if self.kind == "encoder-decoder" else 0)
        return ModelOutput(logits=logits.to(self.input_device), trace=trace)

    def _prefixes_of(self, batch: Batch, source: list[int], ids: list[int]) -> bool:
        """Whether a decoder's ``batch`` is the steps of ``ids`` after ``source``, each read at its last token."""
        longest = self._longest_of_prefixes(batch)
        if longest is None or batch.tokens[int(longest)].tolist() != [*source, *ids[:-1]]:
            return False
        rows = self.explanation_rows(batch.mask.bool())
        return isinstance(rows, Tensor) and rows.tolist() == list(range(len(source) - 1, len(source) + len(ids) - 1))

    def _steps_of(self, batch: Batch, source: list[int], ids: list[int]) -> bool:
        """Whether an encoder-decoder's ``batch`` is the steps of ``ids`` from ``source`` in a forced decision: every row
        the source, row t's decoder the start token and ``ids[:t]``, right-padded."""
        if batch.target is None or batch.target_mask is None or self.explanation_query != -1 or not bool(batch.mask.all()):
            return False
        if any(row != source for row in batch.tokens.tolist()):
            return False
        target, real = batch.target.tolist(), batch.target_mask.tolist()
        return all(target[t][: t + 1] == [self.decoder_start, *ids[:t]] and sum(real[t]) == t + 1 for t in range(len(ids)))

    def forced_distributions(self, source: Sequence[int], target: Sequence[int]) -> Tensor:
        """The next-token distribution ``(len(target), V)`` before each token of a forced ``target``: one teacher-forced pass."""
        encoder_decoder = self.kind == "encoder-decoder"
        with evaluation(self):
            return forced_distributions(self.hf, encoder_decoder, source, self.decoder_start if encoder_decoder else -1, target)

    def rows_logits(self, cache: Cache, rows: Tensor) -> Tensor:
        """:meth:`LanguageModel.rows_logits`: ``decode(lean=True, rows=rows)``, no trace (SDPA where a layer can); ``rows``
        ``(B, R)`` read R rows of each of a batch's examples."""
        return self.decode(cache, keep_layers=(), lean=True, rows=rows).logits

    @contextlib.contextmanager
    def next_token_decision(self) -> Iterator[HFModel]:
        """Within the block a causal LM's predicted next token is its prediction: the classes are the whole vocabulary.

        The model's output already is the next-token logits ``(B, vocab)`` at each example's last real
        token (:meth:`HFModel.decode`); this only marks that output as a decision to explain
        (``trained_head``), so ``probs`` is the real next-token distribution (nothing renormalised over
        a top-k) and every explanation method that needs a prediction applies unchanged. Restored on exit.
        """
        if self.config.extra.get("output") != "next_token":
            raise AttnAuditError("the next-token decision needs a causal language model without a classification head or verbalizer")
        saved = (self.trained_head, self.config.num_labels)
        self.trained_head, self.config.num_labels = True, int(self.config.vocab_size)
        try:
            yield self
        finally:
            self.trained_head, self.config.num_labels = saved


    @contextlib.contextmanager
    def unverbalized(self) -> Iterator[HFModel]:
        """Within the block a decoder made a zero-shot classifier (a prompt and verbalizer, e.g. by ``--task``) is its
        causal LM again: next-token logits over the whole vocabulary (what generating text reads). Restored on exit;
        any other model is left as it is."""
        extra = self.config.extra
        if extra.get("output") != "verbalizer":
            yield self
            return
        saved = (self.trained_head, self.config.num_labels, self.verbalizer_ids, dict(extra))
        self.trained_head, self.config.num_labels, self.verbalizer_ids = False, int(self.config.vocab_size), None
        extra.update(output="next_token", trained_head=False)
        try:
            yield self
        finally:
            self.trained_head, self.config.num_labels, self.verbalizer_ids = saved[:3]
            extra.clear()
            extra.update(saved[3])

    @contextlib.contextmanager
    def forced_decision(self) -> Iterator[HFModel]:
        """Within the block an encoder-decoder's decision is its next target token after a forced target prefix.

        The batch's target is the decoder start token and the prefix (teacher-forced, unpadded); the
        output is the logits over the target vocabulary at its last position, the classes are the
        vocabulary, and the explained items are the source tokens: every explanation method scores what
        in the source made the model continue the target so (the cross-attention of the last position
        for the attention methods). This is the per-step decision a generated sequence is made of."""
        if self.kind != "encoder-decoder":
            raise AttnAuditError("a forced target applies to encoder-decoders; a decoder's prefix is its --text")
        config = self.config
        saved = (self.trained_head, config.num_labels, config.task_type, config.extra["output"], self.explanation_query)
        self.trained_head, config.task_type, config.extra["output"] = True, "classification", "next_token"
        config.num_labels = int(getattr(self.hf.config, "decoder_vocab_size", None) or config.vocab_size)
        self.explanation_query = -1  # the last target position (the target is not padded)
        try:
            yield self
        finally:
            self.trained_head, config.num_labels, config.task_type, config.extra["output"], self.explanation_query = saved


    @contextlib.contextmanager
    def target_side(self) -> Iterator[HFModel]:
        """Within the block an encoder-decoder's explained items are its source tokens and then its decoder inputs after
        the start token (the target prefix a step is conditioned on): ``embed`` gives both sides' embeddings, one after
        the other, and a pass given them feeds the second part to the decoder, so the embedding-based methods
        (registered with ``target_side``) score the earlier target tokens as well. Restored on exit."""
        if self.kind != "encoder-decoder":
            raise AttnAuditError("the target side applies to encoder-decoders; a decoder's earlier tokens are its input")
        saved = self.target_items
        self.target_items = True
        try:
            yield self
        finally:
            self.target_items = saved

    def block_first_layer(self, layer: int) -> int:
        return self.structure.layers_of(self.structure.sites[layer].block)[0]

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
