"""Additive / dot attention over a recurrent, convolutional or context-free encoder.

The model family of Jain & Wallace (2019) and Wiegreffe & Pinter (2019): embed the
tokens, encode them (``bilstm``, ``cnn``, ``average``, or ``bigru`` for the flat HAN
variant), score every state against a learned query (classification) or against the
encoded question (pair tasks: NLI, bAbI QA), normalise the scores with
:func:`attnaudit.models.normalisers.attention_weights`, and classify the weighted sum of
the states. There is exactly one attention layer, so ``encode`` stops at the encoder
states and ``decode`` (attention + output) is cheap to rerun for permutation,
adversarial search and erasure.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Literal

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnaudit.data.types import Batch
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
from attnaudit.models.normalisers import (
    apply_key_interventions,
    apply_weight_interventions,
    attention_weights,
    check_normaliser,
    weights_replaced,
)

ENCODERS = ("bilstm", "cnn", "average", "bigru")
SCORERS = ("tanh", "dot")

_STACKED: ContextVar[bool] = ContextVar("stacked", default=False)


@contextmanager
def stacked_copies() -> Iterator[None]:
    """Run these models under ``torch.func.vmap`` over stacked copies of their parameters (several models trained as
    one, :mod:`attnaudit.training.together`): the recurrence runs step by step (:func:`stepwise_recurrence`), since
    ``vmap`` has no rule for ``nn.LSTM`` / ``nn.GRU`` over packed sequences, and :func:`check_ids`, which reads
    tensor values (``vmap`` cannot), is left to the caller, who checks the stacked ids first."""
    token = _STACKED.set(True)
    try:
        yield
    finally:
        _STACKED.reset(token)


def stepwise_recurrence(rnn: nn.LSTM | nn.GRU, x: Tensor, mask: Tensor) -> Tensor:
    """A single-layer bidirectional ``rnn``'s outputs ``(B,T,2H)`` over ``x`` ``(B,T,E)``, one time step at a time with
    the equations of PyTorch's ``nn.LSTM`` / ``nn.GRU`` (gates ``i, f, g, o`` and ``r, z, n``), zero at padding.

    Written by hand because no library runs several LSTMs with different weights at once: under ``vmap`` these
    matmuls become batched ones for every stacked model. A padded position leaves the state as it was, which is
    what packing computes (a row's backward direction starts at its last real token); tested equal to the packed
    ``nn.LSTM`` / ``nn.GRU``."""
    hidden = rnn.hidden_size
    keep = mask[..., None]
    directions = []
    for suffix, steps in (("", range(x.shape[1])), ("_reverse", range(x.shape[1] - 1, -1, -1))):
        w_hh, b_hh = getattr(rnn, f"weight_hh_l0{suffix}"), getattr(rnn, f"bias_hh_l0{suffix}")
        inputs = x @ getattr(rnn, f"weight_ih_l0{suffix}").T + getattr(rnn, f"bias_ih_l0{suffix}")
        h = c = x.new_zeros(x.shape[0], hidden)
        out: list[Tensor] = [h] * x.shape[1]
        for t in steps:
            if isinstance(rnn, nn.LSTM):
                i, f, g, o = (inputs[:, t] + h @ w_hh.T + b_hh).chunk(4, -1)
                c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h_new = torch.sigmoid(o) * torch.tanh(c_new)
                c = torch.where(keep[:, t], c_new, c)
            else:
                xr, xz, xn = inputs[:, t].chunk(3, -1)
                hr, hz, hn = (h @ w_hh.T + b_hh).chunk(3, -1)
                r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
                h_new = (1 - z) * torch.tanh(xn + r * hn) + z * h
            h = torch.where(keep[:, t], h_new, h)
            out[t] = h
        directions.append(torch.stack(out, 1))
    return torch.cat(directions, -1)


class Encoder(nn.Module):
    """Maps embeddings ``(B,T,E)`` and a mask ``(B,T)`` to states ``(B,T,output_dim)``, zero at padding."""

    output_dim: int

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:  # pragma: no cover - interface
        raise NotImplementedError


class RecurrentEncoder(Encoder):
    """Single-layer bidirectional LSTM or GRU over packed sequences.

    Packing means a padded position is never read, so an example gives the same states
    alone or inside a batch with longer ones. Empty rows (HAN's padding sentences) are
    run with length 1 and then zeroed, because ``pack_padded_sequence`` rejects length 0.
    On CUDA, cuDNN's RNN cannot run backward in eval mode, which every gradient-based
    explanation needs (attention is explained with dropout off); such a pass uses PyTorch's own
    RNN kernels instead, with the same numbers up to float rounding.
    """

    def __init__(self, cell: Literal["lstm", "gru"], input_dim: int, hidden_per_direction: int) -> None:
        super().__init__()
        rnn_class = nn.LSTM if cell == "lstm" else nn.GRU
        self.rnn = rnn_class(input_dim, hidden_per_direction, batch_first=True, bidirectional=True)
        self.output_dim = 2 * hidden_per_direction

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        if _STACKED.get():
            assert isinstance(self.rnn, nn.LSTM | nn.GRU)
            return stepwise_recurrence(self.rnn, x, mask) * mask[..., None].to(x.dtype)
        lengths = mask.sum(-1).clamp_min(1).cpu()
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        backward_in_eval = torch.is_grad_enabled() and not self.training
        with torch.backends.cudnn.flags(enabled=torch.backends.cudnn.enabled and not backward_in_eval):
            out, _ = self.rnn(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        return out * mask[..., None].to(out.dtype)


class ConvEncoder(Encoder):
    """Parallel 'same'-padded convolutions (one per kernel width) + ReLU, concatenated.

    Padding positions are zeroed before the convolution (so a padded token contributes
    exactly what the implicit zero padding beyond the sequence would) and after it.
    """

    def __init__(self, input_dim: int, kernels: Sequence[int], filters: int) -> None:
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv1d(input_dim, filters, k, padding="same") for k in kernels)
        self.output_dim = filters * len(kernels)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        m = mask[..., None].to(x.dtype)
        inputs = (x * m).transpose(1, 2)
        out = torch.cat([torch.relu(conv(inputs)) for conv in self.convs], dim=1).transpose(1, 2)
        return out * m


class AverageEncoder(Encoder):
    """Per-token ``tanh(W e_t + b)``: no context, Wiegreffe & Pinter's diagnostic encoder."""

    def __init__(self, input_dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(input_dim, hidden_dim)
        self.output_dim = hidden_dim

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        return torch.tanh(self.proj(x)) * mask[..., None].to(x.dtype)


def build_encoder(kind: str, input_dim: int, config: ModelConfig) -> Encoder:
    """The encoder named ``kind``; ``bigru`` uses ``hidden_dim // 2`` per direction (HAN's width)."""
    if kind == "bilstm":
        return RecurrentEncoder("lstm", input_dim, config.hidden_dim)
    if kind == "bigru":
        return RecurrentEncoder("gru", input_dim, max(config.hidden_dim // 2, 1))
    if kind == "cnn":
        if not config.cnn_kernels or config.cnn_filters < 1:
            raise AttnAuditError("the cnn encoder needs at least one kernel width and cnn_filters >= 1")
        return ConvEncoder(input_dim, config.cnn_kernels, config.cnn_filters)
    if kind == "average":
        return AverageEncoder(input_dim, config.hidden_dim)
    raise AttnAuditError(f"unknown encoder {kind!r}; choose one of {', '.join(ENCODERS)}")


class AdditiveScorer(nn.Module):
    """``v^T tanh(W k_t + U q + b)`` (Bahdanau et al.); without a question ``v`` is the learned context vector."""

    def __init__(self, key_dim: int, hidden_dim: int, query_dim: int | None = None) -> None:
        super().__init__()
        self.key_proj = nn.Linear(key_dim, hidden_dim)
        self.query_proj = nn.Linear(query_dim, hidden_dim, bias=False) if query_dim is not None else None
        self.v = nn.Linear(hidden_dim, 1, bias=False)

    def forward(self, keys: Tensor, query: Tensor | None = None) -> Tensor:
        """Keys ``(B,1,T,d)`` (and question ``(B,dq)``) -> scores ``(B,1,1,T)``."""
        hidden = self.key_proj(keys)
        if self.query_proj is not None:
            if query is None:
                raise AttnAuditError("this attention scorer is question-conditioned but got no question")
            hidden = hidden + self.query_proj(query)[:, None, None, :]
        return self.v(torch.tanh(hidden)).transpose(-1, -2)


class DotScorer(nn.Module):
    """``k_t . q / sqrt(d)`` with ``q`` a learned vector, or ``W q`` for a question ``q``."""

    def __init__(self, key_dim: int, query_dim: int | None = None) -> None:
        super().__init__()
        self.scale = math.sqrt(key_dim)
        if query_dim is None:
            self.query: nn.Parameter | None = nn.Parameter(torch.randn(key_dim) / math.sqrt(key_dim))
            self.query_proj: nn.Linear | None = None
        else:
            self.query = None
            self.query_proj = nn.Linear(query_dim, key_dim, bias=False)

    def forward(self, keys: Tensor, query: Tensor | None = None) -> Tensor:
        """Keys ``(B,1,T,d)`` (and question ``(B,dq)``) -> scores ``(B,1,1,T)``."""
        if self.query_proj is not None:
            if query is None:
                raise AttnAuditError("this attention scorer is question-conditioned but got no question")
            q = self.query_proj(query)
        else:
            assert self.query is not None
            q = self.query.expand(keys.shape[0], -1)
        return (keys @ q[:, None, :, None]).transpose(-1, -2) / self.scale


def build_scorer(kind: str, key_dim: int, hidden_dim: int, query_dim: int | None = None) -> nn.Module:
    """``tanh`` (additive) or ``dot`` scorer over keys of width ``key_dim``."""
    if kind == "tanh":
        return AdditiveScorer(key_dim, hidden_dim, query_dim)
    if kind == "dot":
        return DotScorer(key_dim, query_dim)
    raise AttnAuditError(f"unknown attention scorer {kind!r}; choose one of {', '.join(SCORERS)}")


def resolve_start_layer(cache: Cache, start_layer: int | None, num_layers: int) -> int:
    """The layer ``decode`` starts at; it must be the one whose inputs ``cache`` holds."""
    start = cache.layer if start_layer is None else start_layer
    if not -num_layers <= start < num_layers:
        raise AttnAuditError(f"start_layer {start} out of range for a model with {num_layers} attention layer(s)")
    start %= num_layers
    if start != cache.layer:
        raise AttnAuditError(
            f"the cache holds the inputs of attention layer {cache.layer}, not {start}; "
            "build one with model.cache_at(trace, layer, cache)"
        )
    return start


def attend(
    states: Tensor,
    mask: Tensor,
    scorer: nn.Module,
    normaliser: str,
    interventions: Sequence[Intervention],
    query: Tensor | None = None,
    name: str = "attention",
) -> tuple[Tensor, AttentionLayer]:
    """One single-query attention over ``states`` ``(B,T,d)``: context ``(B,d)`` and its record.

    ``interventions`` must already be filtered to this layer. Keys and values are both the
    states; a keys intervention changes what the scorer sees, never the values. Weights replaced by a
    tensor skip the scorer (the record then has no scores).
    """
    values = states[:, None]
    keys = apply_key_interventions(values, interventions)
    scores: Tensor | None = None
    if weights_replaced(interventions):  # given weights (permuted, adversarial): the scorer's work is unused
        shape = states.new_zeros(()).expand(states.shape[0], 1, 1, states.shape[1])
        weights = apply_weight_interventions(shape, mask, interventions)
    else:
        scores = scorer(keys, query).masked_fill(~mask[:, None, None, :], float("-inf"))
        weights = attention_weights(scores, mask, normaliser, interventions)
    context = (weights @ values)[:, 0, 0]
    record = AttentionLayer(
        weights=weights, mask=mask, inputs=states, keys=keys, values=values, scores=scores, name=name
    )
    return context, record


def wrap_ends(embeddings: Tensor, mask: Tensor, start: Tensor, end: Tensor) -> tuple[Tensor, Tensor]:
    """``(B,T+2,E)`` embeddings and mask of each (left-aligned) row between ``start`` and ``end``:
    ``start`` at position 0, the row's tokens at 1..n, ``end`` at n+1, padding after."""
    b, t, _ = embeddings.shape
    lengths = mask.sum(-1)
    positions = torch.arange(t + 2, device=mask.device)[None, :]
    body = torch.cat([embeddings.new_zeros(b, 1, embeddings.shape[-1]), embeddings * mask[..., None].to(embeddings.dtype),
                      embeddings.new_zeros(b, 1, embeddings.shape[-1])], dim=1)
    body = torch.where((positions == 0)[..., None], start, body)
    body = torch.where((positions == lengths[:, None] + 1)[..., None], end, body)
    return body, positions < lengths[:, None] + 2


def check_ids(ids: Tensor, vocab_size: int, what: str) -> None:
    """Token ids must index the embedding table; say so in one line rather than an IndexError (under
    :func:`stacked_copies` the caller has checked them)."""
    if not _STACKED.get() and ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise AttnAuditError(f"{what} ids must lie in [0, {vocab_size}); got {int(ids.min())}..{int(ids.max())}")


class _SingleAttentionModel(AttentionModel):
    """Shared parts of the one-attention-layer models: embedding, dropout, passage encoder."""

    explained_layer = 0

    def __init__(self, config: ModelConfig, encoder: str | None = None) -> None:
        super().__init__(config)
        check_normaliser(config.attention)
        self.embedding = nn.Embedding(config.vocab_size, config.embed_dim, padding_idx=config.pad_id)
        self.dropout = nn.Dropout(config.dropout)
        self.encoder = build_encoder(encoder or config.model, config.embed_dim, config)

    @property
    def num_attention_layers(self) -> int:
        return 1

    def embed(self, batch: Batch) -> Tensor:
        """(Passage) token embeddings ``(B,T,E)``: attention is over them, so gradients are too."""
        if batch.tokens.dim() != 2:
            raise AttnAuditError(f"{self.config.model} expects tokens (B,T), got shape {tuple(batch.tokens.shape)}")
        check_ids(batch.tokens, self.config.vocab_size, "token")
        return self.embedding(batch.tokens)

    @property
    def wraps(self) -> bool:
        """Whether the encoder reads every sentence between ``<s>`` and ``</s>`` (``extra["wrap"]``)."""
        return bool(self.config.extra.get("wrap"))

    def encoder_states(self, embeddings: Tensor, mask: Tensor) -> Tensor:
        """Encoder states ``(B,T,d)`` from embeddings: the only part leave-one-out must rerun.

        A wrapping model (Jain & Wallace's protocol) encodes ``<s> tokens </s>`` and returns the
        states of the tokens only: the ends shape the recurrent states but are never attended
        to, explained, removed or permuted — to every test they are not items.
        """
        if not self.wraps:
            return self.encoder(embeddings, mask)
        start, end = self.embedding.weight[torch.tensor(self.config.extra["wrap"], device=embeddings.device)]
        wrapped, wrapped_mask = wrap_ends(embeddings, mask, start, end)
        return self.encoder(wrapped, wrapped_mask)[:, 1:-1] * mask[..., None].to(embeddings.dtype)


class AttentionClassifier(_SingleAttentionModel):
    """Encoder + attention with a learned query + ``Linear(context)`` (Jain & Wallace 2019).

    ``encoder`` overrides ``config.model`` as the encoder name (the flat HAN variant uses
    ``bigru``).
    """

    def __init__(self, config: ModelConfig, encoder: str | None = None) -> None:
        super().__init__(config, encoder)
        d = self.encoder.output_dim
        self.scorer = build_scorer(config.scorer, d, config.hidden_dim)
        self.output = nn.Linear(d, config.num_labels)

    def encode(self, batch: Batch, embeddings: Tensor | None = None) -> Cache:
        emb = self.embed(batch) if embeddings is None else embeddings
        mask = batch.mask.bool()
        return Cache(states=self.encoder_states(self.dropout(emb), mask), mask=mask, layer=0)

    def decode(
        self,
        cache: Cache,
        interventions: Sequence[Intervention] = (),
        start_layer: int | None = None,
    ) -> ModelOutput:
        """Attention over the cached states and the output layer."""
        resolve_start_layer(cache, start_layer, 1)
        context, record = attend(
            cache.states,
            cache.mask.bool(),
            self.scorer,
            self.config.attention,
            interventions_for(interventions, 0, 1),
        )
        return ModelOutput(logits=self.output(context), trace=AttentionTrace([record]))


PAIR_HEADS = ("jain-wallace", "madsen2022")
"""How a pair model reads its question and decides (``config.extra["pair_head"]``, data rather than a subclass):
``jain-wallace`` (the default) as :class:`PairAttentionClassifier` describes; ``madsen2022`` as Madsen et al. (2022)'s
code (``nlproar/model/rnn_multiple_sequence_to_class.py``): the question has its own embedding table (a copy of the
passage's at the start), its vector is the question encoder's final states (forward and backward), and the output is
``Linear(tanh(Linear(c) + Linear(q)))``."""


class PairAttentionClassifier(_SingleAttentionModel):
    """Question-conditioned attention over a passage (Jain & Wallace's NLI/QA model).

    Passage (``batch.tokens``: SNLI premise, bAbI story) and question (``batch.query``:
    hypothesis, question) have separate encoders of the same kind. The question vector
    ``q`` is the mean of the question states over real tokens: with a bidirectional
    encoder every state has seen the whole (short) question, and unlike final states the
    mean is defined for every encoder kind. Attention scores each passage state against
    ``q``; the output is ``Linear(tanh(Linear([c; q; c*q; |c-q|])))``. ``extra["pair_head"]``
    ``madsen2022`` reads and decides as Madsen et al.'s code does instead (:data:`PAIR_HEADS`).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.head = str(config.extra.get("pair_head", PAIR_HEADS[0]))
        if self.head not in PAIR_HEADS:
            raise AttnAuditError(f"unknown pair head {self.head!r}; choose {', '.join(PAIR_HEADS)}")
        self.query_encoder = build_encoder(config.model, config.embed_dim, config)
        d = self.encoder.output_dim
        self.scorer = build_scorer(config.scorer, d, config.hidden_dim, query_dim=d)
        if self.head == "madsen2022":
            if not isinstance(self.query_encoder, RecurrentEncoder):
                raise AttnAuditError(f"pair head madsen2022 reads the question's final recurrent states: use bilstm or bigru, not {config.model}")
            self.query_embedding = nn.Embedding(config.vocab_size, config.embed_dim, padding_idx=config.pad_id)
            with torch.no_grad():
                self.query_embedding.weight.copy_(self.embedding.weight)  # theirs: both tables start from one matrix
            self.combine_context = nn.Linear(d, config.hidden_dim)
            self.combine_query = nn.Linear(d, config.hidden_dim)
        else:
            self.combine = nn.Linear(4 * d, config.hidden_dim)
        self.output = nn.Linear(config.hidden_dim, config.num_labels)

    def encode_query(self, batch: Batch) -> Tensor:
        """The question vector ``(B,d)``: mean of the question states over real tokens (``madsen2022``: the final
        forward state, at the last real token, beside the final backward state, at the first)."""
        if batch.query is None or batch.query_mask is None:
            raise AttnAuditError("a pair model needs batches with query and query_mask (hypothesis or question)")
        check_ids(batch.query, self.config.vocab_size, "query token")
        qmask = batch.query_mask.bool()
        table = self.query_embedding if self.head == "madsen2022" else self.embedding
        states = self.query_encoder(self.dropout(table(batch.query)), qmask)
        if self.head == "madsen2022":
            half = states.shape[-1] // 2
            last = qmask.sum(1).clamp_min(1) - 1
            return torch.cat([states[torch.arange(states.shape[0], device=states.device), last, :half], states[:, 0, half:]], dim=-1)
        m = qmask[..., None].to(states.dtype)
        return (states * m).sum(1) / m.sum(1).clamp_min(1.0)

    def encode(self, batch: Batch, embeddings: Tensor | None = None) -> Cache:
        emb = self.embed(batch) if embeddings is None else embeddings
        mask = batch.mask.bool()
        states = self.encoder_states(self.dropout(emb), mask)
        return Cache(states=states, mask=mask, layer=0, extra={"query": self.encode_query(batch)})

    def decode(
        self,
        cache: Cache,
        interventions: Sequence[Intervention] = (),
        start_layer: int | None = None,
    ) -> ModelOutput:
        """Question-conditioned attention over the cached passage states and the QA decoder."""
        resolve_start_layer(cache, start_layer, 1)
        q = cache.extra["query"]
        context, record = attend(
            cache.states,
            cache.mask.bool(),
            self.scorer,
            self.config.attention,
            interventions_for(interventions, 0, 1),
            query=q,
        )
        if self.head == "madsen2022":
            hidden = self.combine_context(self.dropout(context)) + self.combine_query(self.dropout(q))
        else:
            hidden = self.combine(self.dropout(torch.cat([context, q, context * q, (context - q).abs()], dim=-1)))
        logits = self.output(torch.tanh(hidden))
        return ModelOutput(logits=logits, trace=AttentionTrace([record]))


def build_rnn_model(config: ModelConfig) -> AttentionModel:
    """The classifier for ``classification``, the question-conditioned model for ``pair``."""
    if config.model not in ENCODERS:
        raise AttnAuditError(f"unknown encoder {config.model!r}; choose one of {', '.join(ENCODERS)}")
    if config.task_type == "classification":
        return AttentionClassifier(config)
    if config.task_type == "pair":
        return PairAttentionClassifier(config)
    raise AttnAuditError(
        f"no {config.model} attention model for task_type {config.task_type!r}; use classification or pair"
    )
