"""Hierarchical Attention Network (Yang et al. 2016) and its flat variant (Serrano & Smith 2019).

HAN reads a document as sentences of words (``batch.tokens`` ``(B,S,W)``): a word-level
biGRU + attention turns each sentence into a vector, a sentence-level biGRU + attention
turns the sentences into a document vector, and a Linear layer classifies it. Attention
layer 0 is the word level (sentences flattened to ``B*S`` rows), layer 1 the sentence
level, which is the one Serrano & Smith's erasure tests examine (``explained_layer``).
The flat variant drops the hierarchy: one biGRU + attention over all tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from attnaudit.data.types import Batch
from attnaudit.errors import AttnAuditError
from attnaudit.models.interface import (
    AttentionModel,
    AttentionTrace,
    Cache,
    Intervention,
    ModelConfig,
    ModelOutput,
    interventions_for,
)
from attnaudit.models.normalisers import check_normaliser
from attnaudit.models.rnn import (
    AttentionClassifier,
    RecurrentEncoder,
    attend,
    build_scorer,
    check_ids,
    resolve_start_layer,
)


class HierarchicalAttentionNetwork(AttentionModel):
    """Word biGRU + attention -> sentence vectors; sentence biGRU + attention -> Linear.

    Both GRUs use ``hidden_dim // 2`` units per direction; both attentions use
    ``config.scorer`` (``tanh``: Yang et al.'s ``u^T tanh(W h + b)`` with a learned context
    vector ``u``). Sentences are padded at the end of a document, words at the end of a
    sentence; a padding sentence gets all-zero word weights and a zero vector and is
    masked out of the sentence level.
    """

    explained_layer = 1

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        check_normaliser(config.attention)
        per_direction = max(config.hidden_dim // 2, 1)
        self.embedding = nn.Embedding(config.vocab_size, config.embed_dim, padding_idx=config.pad_id)
        self.dropout = nn.Dropout(config.dropout)
        self.word_encoder = RecurrentEncoder("gru", config.embed_dim, per_direction)
        d = self.word_encoder.output_dim
        self.word_scorer = build_scorer(config.scorer, d, config.hidden_dim)
        self.sentence_encoder = RecurrentEncoder("gru", d, per_direction)
        self.sentence_scorer = build_scorer(config.scorer, d, config.hidden_dim)
        self.output = nn.Linear(d, config.num_labels)

    @property
    def num_attention_layers(self) -> int:
        return 2

    def embed(self, batch: Batch) -> Tensor:
        """Token embeddings ``(B,S,W,E)``."""
        if batch.tokens.dim() != 3:
            shape = tuple(batch.tokens.shape)
            raise AttnAuditError(f"han expects tokens (B,S,W) split into sentences, got shape {shape}")
        check_ids(batch.tokens, self.config.vocab_size, "token")
        return self.embedding(batch.tokens)

    def encoder_states(self, embeddings: Tensor, mask: Tensor) -> Tensor:
        """Word-GRU states ``(B*S,W,d)`` from embeddings ``(B,S,W,E)`` and mask ``(B,S,W)``."""
        b, s, w = mask.shape
        return self.word_encoder(embeddings.reshape(b * s, w, -1), mask.reshape(b * s, w))

    def encode(self, batch: Batch, embeddings: Tensor | None = None) -> Cache:
        """Word-GRU states of every sentence; ``extra["sentence_mask"]`` ``(B,S)`` keeps the structure."""
        emb = self.embed(batch) if embeddings is None else embeddings
        mask = batch.mask.bool()
        b, s, w = mask.shape
        states = self.encoder_states(self.dropout(emb), mask)
        return Cache(states=states, mask=mask.reshape(b * s, w), layer=0, extra={"sentence_mask": mask.any(-1)})

    def decode(
        self,
        cache: Cache,
        interventions: Sequence[Intervention] = (),
        start_layer: int | None = None,
    ) -> ModelOutput:
        """From layer 0: word attention, sentence GRU, sentence attention, output; from layer 1: the last two."""
        start = resolve_start_layer(cache, start_layer, 2)
        trace = AttentionTrace()
        if start == 0:
            sentence_mask = cache.extra["sentence_mask"].bool()
            b, s = sentence_mask.shape
            sentences, record = attend(
                cache.states,
                cache.mask.bool(),
                self.word_scorer,
                self.config.attention,
                interventions_for(interventions, 0, 2),
                name="word",
            )
            trace.layers.append(record)
            states = self.sentence_encoder(sentences.reshape(b, s, -1), sentence_mask)
        else:
            states, sentence_mask = cache.states, cache.mask.bool()
        document, record = attend(
            states,
            sentence_mask,
            self.sentence_scorer,
            self.config.attention,
            interventions_for(interventions, 1, 2),
            name="sentence",
        )
        trace.layers.append(record)
        return ModelOutput(logits=self.output(document), trace=trace)

    def cache_at(self, trace: AttentionTrace, layer: int, base: Cache) -> Cache:
        """Restart at ``layer``: word-GRU states for 0, sentence-GRU states ``(B,S,d)`` for 1.

        ``trace`` may come from a decode that started at layer 1 (it then holds one layer).
        """
        layer %= 2
        index = layer - (2 - len(trace))
        if index < 0:
            raise AttnAuditError(f"the trace does not contain attention layer {layer}")
        entry = trace[index]
        return Cache(states=entry.inputs, mask=entry.mask, layer=layer, extra=dict(base.extra))


class FlatAttentionClassifier(AttentionClassifier):
    """HAN without the hierarchy: a biGRU (``hidden_dim // 2`` per direction) + attention over all tokens."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config, encoder="bigru")


def build_han_model(config: ModelConfig) -> AttentionModel:
    """``han`` or ``flat``, for document classification."""
    if config.task_type != "classification":
        raise AttnAuditError(
            f"{config.model} is a document classifier; task_type {config.task_type!r} is not supported"
        )
    if config.model == "han":
        return HierarchicalAttentionNetwork(config)
    if config.model == "flat":
        return FlatAttentionClassifier(config)
    raise AttnAuditError(f"unknown hierarchical model {config.model!r}; choose han or flat")
