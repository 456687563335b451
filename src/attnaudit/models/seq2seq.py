"""A small encoder-decoder Transformer for NMT, with greedy decoding.

Its training, evaluation (BLEU) and run directories are :mod:`attnaudit.training.nmt`.

Post-LN blocks as in Vaswani et al. (2017), built from the encoder layer and the
:func:`~attnaudit.models.transformer.multi_head_attention` of ``transformer.py``:
the encoder stacks :class:`~attnaudit.models.transformer.EncoderLayer`; each decoder block
runs causal self-attention, cross-attention over the encoder output, then the feed-forward
block. Target embeddings are tied to the output projection.

The trace lists every attention computation in order — ``enc0..enc{L-1}`` (encoder
self-attention), then per decoder block ``self{l}`` and ``cross{l}`` — so trace index
``L + 2l + 1`` is the cross-attention of block ``l`` (:attr:`Seq2SeqTransformer.cross_layers`).
A cross-attention record has weights ``(B,H,T_tgt,T_src)``, ``mask`` the source mask,
``query_mask`` the target mask and ``inputs`` the encoder output (the vectors that are
weighted), and ``value_output_maps(i)`` gives that layer's ``W_V``/``W_O``, so the
norm analysis of Kobayashi et al. (2020) works on it unchanged.

``ModelConfig`` use: ``vocab_size`` = source BPE vocabulary, ``num_labels`` = target BPE
vocabulary, ``layers`` = blocks per stack (encoder and decoder), ``embed_dim == d_model``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

import torch
from torch import Tensor, nn

from attnaudit.data.types import Batch
from attnaudit.data.word_alignments import BOS_ID, EOS_ID
from attnaudit.errors import AttnAuditError
from attnaudit.models.interface import (
    AttentionLayer,
    AttentionModel,
    AttentionTrace,
    Cache,
    Intervention,
    ModelConfig,
    ModelOutput,
    interventions_for,
)
from attnaudit.models.normalisers import check_normaliser
from attnaudit.models.transformer import (
    EncoderLayer,
    multi_head_attention,
    sinusoidal_positions,
)


class CrossAttention(nn.Module):
    """The projections of one encoder-decoder attention (queries: decoder, keys/values: encoder)."""

    def __init__(self, d_model: int, heads: int, normaliser: str) -> None:
        super().__init__()
        self.heads = heads
        self.normaliser = normaliser
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)


class DecoderLayer(EncoderLayer):
    """Post-LN decoder block: causal self-attention (the inherited projections and
    ``attention_norm``), cross-attention (``cross``, ``cross_norm``), feed-forward (inherited)."""

    def __init__(self, d_model: int, heads: int, d_ff: int, dropout: float, normaliser: str) -> None:
        super().__init__(d_model, heads, d_ff, dropout, normaliser)
        self.cross = CrossAttention(d_model, heads, normaliser)
        self.cross_norm = nn.LayerNorm(d_model)

    def forward(  # type: ignore[override]
        self,
        x: Tensor,
        mask: Tensor,
        memory: Tensor,
        memory_mask: Tensor,
        self_interventions: Sequence[Intervention],
        cross_interventions: Sequence[Intervention],
        index: int,
    ) -> tuple[Tensor, AttentionLayer, AttentionLayer]:
        """New decoder states and the self- and cross-attention records of block ``index``."""
        attended, self_record = multi_head_attention(self, x, mask, self_interventions, f"self{index}", causal=True)
        h = self.attention_norm(x + self.dropout(attended))
        crossed, cross_record = multi_head_attention(
            self.cross, h, mask, cross_interventions, f"cross{index}", memory=memory, memory_mask=memory_mask
        )
        h = self.cross_norm(h + self.dropout(crossed))
        return self.ffn_norm(h + self.dropout(self.ffn(h))), self_record, cross_record


class EncoderDecoderLayout:
    """Trace indices of an encoder-decoder: the ``E`` encoder layers, then per decoder block ``l``
    its self-attention (``E + 2l``) and cross-attention (``E + 2l + 1``). Shared by our NMT
    model and the Hugging Face encoder-decoders; ``_layout()`` gives ``(E, decoder blocks)``."""

    @property
    def num_attention_layers(self) -> int:
        raise NotImplementedError

    def _layout(self) -> tuple[int, int]:
        raise NotImplementedError

    @property
    def cross_layers(self) -> list[int]:
        """Trace indices of the cross-attention layers, decoder block 0 first."""
        n, blocks = self._layout()
        return [n + 2 * block + 1 for block in range(blocks)]

    def layer_name(self, index: int) -> str:
        """``enc{l}``, ``self{l}`` or ``cross{l}`` for trace index ``index``."""
        n = self._layout()[0]
        index = self._resolve(index)
        if index < n:
            return f"enc{index}"
        block, kind = divmod(index - n, 2)
        return f"{'cross' if kind else 'self'}{block}"

    def _resolve(self, index: int) -> int:
        total = self.num_attention_layers
        if not -total <= index < total:
            raise AttnAuditError(f"attention layer {index} out of range for a model with {total} attention layers")
        return index % total


class Seq2SeqTransformer(EncoderDecoderLayout, AttentionModel):
    """Encoder-decoder Transformer; ``forward(batch)`` is teacher-forced on ``batch.target``.

    Logits are ``(B, T_tgt, V_tgt)``: position ``p`` predicts ``batch.labels[:, p]``.
    ``explained_layer`` is the last cross-attention layer.
    """

    positions: Tensor  # the sinusoidal table, a non-persistent buffer

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        if config.task_type != "seq2seq":
            raise AttnAuditError(f"Seq2SeqTransformer needs task_type seq2seq, got {config.task_type}")
        if config.d_model % config.heads:
            raise AttnAuditError(f"d_model={config.d_model} is not divisible by heads={config.heads}")
        if config.layers < 1:
            raise AttnAuditError(f"a Transformer needs at least one layer, got layers={config.layers}")
        check_normaliser(config.attention)
        d = config.d_model
        self.source_embedding = nn.Embedding(config.vocab_size, d, padding_idx=config.pad_id)
        self.target_embedding = nn.Embedding(config.num_labels, d, padding_idx=config.pad_id)
        for table in (self.source_embedding, self.target_embedding):
            nn.init.normal_(table.weight, std=d**-0.5)
            with torch.no_grad():
                table.weight[config.pad_id].zero_()
        self.output_bias = nn.Parameter(torch.zeros(config.num_labels))
        self.scale = math.sqrt(d)
        self.register_buffer("positions", sinusoidal_positions(config.max_len, d), persistent=False)
        self.dropout = nn.Dropout(config.dropout)
        args = (d, config.heads, config.d_ff, config.dropout, config.attention)
        self.encoder = nn.ModuleList(EncoderLayer(*args) for _ in range(config.layers))
        self.decoder = nn.ModuleList(DecoderLayer(*args) for _ in range(config.layers))
        self.explained_layer = 3 * config.layers - 1

    @property
    def num_attention_layers(self) -> int:
        return 3 * len(self.encoder)

    def _layout(self) -> tuple[int, int]:
        return len(self.encoder), len(self.decoder)

    has_value_output = True

    def value_output_maps(self, layer: int) -> tuple[Tensor, Tensor, Tensor, int]:
        """``(W_V, b_V, W_O, heads)`` of trace layer ``layer`` (right-multiplied maps, as in
        :meth:`~attnaudit.models.transformer.TransformerEncoderModel.value_output_maps`)."""
        n = len(self.encoder)
        index = self._resolve(layer)
        block: EncoderLayer | CrossAttention
        if index < n:
            block = cast(EncoderLayer, self.encoder[index])
        else:
            number, kind = divmod(index - n, 2)
            decoder = cast(DecoderLayer, self.decoder[number])
            block = decoder.cross if kind else decoder
        return block.v_proj.weight.t(), block.v_proj.bias, block.out_proj.weight.t(), self.config.heads

    # --- embeddings ------------------------------------------------------------------

    def _check(self, ids: Tensor, size: int, what: str) -> None:
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= size):
            raise AttnAuditError(f"{what} ids must lie in [0, {size}); got {int(ids.min())}..{int(ids.max())}")
        if ids.shape[-1] > self.config.max_len:
            raise AttnAuditError(f"{what} sequence of length {ids.shape[-1]} exceeds max_len={self.config.max_len}")

    def embed(self, batch: Batch) -> Tensor:
        """Source token embeddings ``(B,S,d)`` (the gradient target)."""
        self._check(batch.tokens, self.config.vocab_size, "source")
        return self.source_embedding(batch.tokens)

    def _positioned(self, embeddings: Tensor) -> Tensor:
        return self.dropout(embeddings * self.scale + self.positions[: embeddings.shape[1]])

    def embed_target(self, target: Tensor) -> Tensor:
        """Decoder input states ``(B,T,d)`` from target ids (scaled embeddings + positions)."""
        self._check(target, self.config.num_labels, "target")
        return self._positioned(self.target_embedding(target))

    def encode(self, batch: Batch, embeddings: Tensor | None = None) -> Cache:
        """Source states entering encoder layer 0; the embedded decoder input rides in ``extra``."""
        emb = self.embed(batch) if embeddings is None else embeddings
        extra: dict[str, Any] = {}
        if batch.target is not None:
            if batch.target_mask is None:
                raise AttnAuditError("a seq2seq batch with target needs target_mask")
            extra = {"target_states": self.embed_target(batch.target), "target_mask": batch.target_mask.bool()}
        return Cache(states=self._positioned(emb), mask=batch.mask.bool(), layer=0, extra=extra)

    # --- attention stacks ------------------------------------------------------------

    def _interventions(self, interventions: Sequence[Intervention], layer: int) -> list[Intervention]:
        return interventions_for(interventions, layer, self.num_attention_layers)

    def run_encoder(
        self, states: Tensor, mask: Tensor, interventions: Sequence[Intervention] = (), start: int = 0,
        trace: AttentionTrace | None = None,
    ) -> Tensor:
        """Encoder layers ``start``..L-1; records are appended to ``trace`` when given."""
        for index in range(start, len(self.encoder)):
            states, record = self.encoder[index](states, mask, self._interventions(interventions, index), f"enc{index}")
            if trace is not None:
                trace.layers.append(record)
        return states

    def run_decoder(
        self, states: Tensor, mask: Tensor, memory: Tensor, memory_mask: Tensor,
        interventions: Sequence[Intervention] = (), first_block: int = 0, trace: AttentionTrace | None = None,
    ) -> Tensor:
        """Decoder blocks ``first_block``..L-1: final decoder states ``(B,T,d)``."""
        n = len(self.encoder)
        for block in range(first_block, n):
            self_index = n + 2 * block
            states, self_record, cross_record = self.decoder[block](
                states, mask, memory, memory_mask,
                self._interventions(interventions, self_index), self._interventions(interventions, self_index + 1), block,
            )
            if trace is not None:
                trace.layers += [self_record, cross_record]
        return states

    def project(self, states: Tensor) -> Tensor:
        """Logits ``(..., V_tgt)`` from decoder states: the output layer tied to the target embeddings."""
        return states @ self.target_embedding.weight.t() + self.output_bias

    def decode(
        self, cache: Cache, interventions: Sequence[Intervention] = (), start_layer: int | None = None
    ) -> ModelOutput:
        """Attention layer ``start_layer`` (an encoder layer or a decoder ``self{l}``) onwards.

        Restarting at a ``cross{l}`` layer is refused: its queries are an intermediate state
        of the decoder block that the trace does not record.
        """
        n = len(self.encoder)
        start = self._resolve(cache.layer if start_layer is None else start_layer)
        trace = AttentionTrace()
        if start < n:
            if "target_states" not in cache.extra:
                raise AttnAuditError("the NMT model's forward is teacher-forced: the batch needs a target")
            memory_mask = cache.mask.bool()
            memory = self.run_encoder(cache.states, memory_mask, interventions, start, trace)
            states, mask, first = cache.extra["target_states"], cache.extra["target_mask"], 0
        else:
            first, kind = divmod(start - n, 2)
            if kind:
                raise AttnAuditError(
                    f"cannot restart at cross-attention layer {start} ({self.layer_name(start)}); "
                    f"restart at {self.layer_name(start - 1)} (layer {start - 1})"
                )
            memory, memory_mask = cache.extra["memory"], cache.extra["memory_mask"]
            states, mask = cache.states, cache.mask.bool()
        states = self.run_decoder(states, mask, memory, memory_mask, interventions, first, trace)
        return ModelOutput(logits=self.project(states), trace=trace)

    def cache_at(self, trace: AttentionTrace, layer: int, base: Cache) -> Cache:
        """Restart at encoder layer ``layer`` or decoder ``self{l}`` of a full trace."""
        n = len(self.encoder)
        layer = self._resolve(layer)
        if len(trace) != self.num_attention_layers:
            raise AttnAuditError("cache_at needs the full trace of a forward pass")
        entry = trace[layer]
        if layer < n:
            return Cache(states=entry.inputs, mask=entry.mask, layer=layer, extra=dict(base.extra))
        if (layer - n) % 2:
            raise AttnAuditError(f"cannot restart at cross-attention layer {layer}; restart at layer {layer - 1}")
        cross = trace[layer + 1]
        extra = {**base.extra, "memory": cross.inputs, "memory_mask": cross.mask}
        assert entry.query_mask is not None  # multi_head_attention records it on every layer
        return Cache(states=entry.inputs, mask=entry.query_mask, layer=layer, extra=extra)

    @torch.no_grad()
    def greedy(self, batch: Batch, max_len_a: float = 1.5, max_len_b: int = 10) -> list[list[int]]:
        """Greedy decoding: target subword ids per example (no ``<s>``/``</s>``).

        At most ``max_len_a * source_length + max_len_b`` steps (capped by ``max_len``);
        the decoder is rerun on the whole prefix each step (no key/value cache: these models
        are small and decoding is not the bottleneck of the alignment study).
        """
        was_training = self.training
        self.eval()
        memory_mask = batch.mask.bool()
        memory = self.run_encoder(self._positioned(self.embed(batch)), memory_mask)
        b = batch.tokens.shape[0]
        steps = min(int(max_len_a * int(memory_mask.sum(1).max()) + max_len_b), self.config.max_len - 1)
        ids = torch.full((b, 1), BOS_ID, dtype=torch.long, device=batch.tokens.device)
        done = torch.zeros(b, dtype=torch.bool, device=ids.device)
        for _ in range(steps):
            mask = torch.ones_like(ids, dtype=torch.bool)
            logits = self.project(self.run_decoder(self.embed_target(ids), mask, memory, memory_mask)[:, -1])
            token = logits.argmax(-1).masked_fill(done, EOS_ID)
            ids = torch.cat([ids, token[:, None]], dim=1)
            done |= token == EOS_ID
            if bool(done.all()):
                break
        self.train(was_training)
        out = []
        for row in ids[:, 1:].tolist():
            out.append(row[: row.index(EOS_ID)] if EOS_ID in row else row)
        return out
