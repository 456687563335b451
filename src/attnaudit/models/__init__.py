"""Model families behind one interface, built from a :class:`ModelConfig` by name."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module

import torch

from attnaudit.bounds import model_parameters
from attnaudit.errors import AttnAuditError
from attnaudit.models.interface import (
    AttentionLayer,
    AttentionModel,
    AttentionTrace,
    Cache,
    Intervention,
    ModelConfig,
    ModelOutput,
    detach_weights,
    evaluation,
    freeze_to,
    freeze_uniform,
    uniform_weights,
)

# name -> (module, builder, description); modules import lazily so the CLI starts fast.
MODELS: dict[str, tuple[str, str, str]] = {
    "bilstm": ("attnaudit.models.rnn", "build_rnn_model", "BiLSTM encoder + additive/dot attention (Jain & Wallace)"),
    "cnn": ("attnaudit.models.rnn", "build_rnn_model", "CNN encoder (kernels 1,3,5,7 x 32) + attention"),
    "average": ("attnaudit.models.rnn", "build_rnn_model", "context-free per-token MLP + attention (Wiegreffe & Pinter)"),
    "han": ("attnaudit.models.han", "build_han_model", "Hierarchical Attention Network, word + sentence GRU (Yang et al.)"),
    "flat": ("attnaudit.models.han", "build_han_model", "flat variant of HAN: one biGRU + attention over all tokens"),
    "transformer": (
        "attnaudit.models.transformer",
        "build_transformer_model",
        "Transformer encoder classifier/tagger, softmax/entmax15/sparsemax attention",
    ),
}


def build_model(config: ModelConfig) -> AttentionModel:
    """Instantiate the family named by ``config.model``."""
    if config.model not in MODELS:
        raise AttnAuditError(f"unknown model {config.model!r}; choose one of {', '.join(MODELS)}")
    module, builder, _ = MODELS[config.model]
    build: Callable[[ModelConfig], AttentionModel] = getattr(import_module(module), builder)
    model_parameters(lambda: build(config), f"a {config.model} model")  # refused before any memory is allocated
    return zero_rows(build(config), config)


WORD_TABLES = ("embedding", "query_embedding")
"""A model's word-embedding tables: the words', and a pair model's question's where it has its own (``madsen2022``)."""


def word_tables(model: AttentionModel) -> list[torch.nn.Embedding]:
    """The word-embedding tables of :data:`WORD_TABLES` that ``model`` has."""
    return [t for name in WORD_TABLES if isinstance(t := getattr(model, name, None), torch.nn.Embedding)]


def zero_rows(model: AttentionModel, config: ModelConfig) -> AttentionModel:
    """``model`` with the word-embedding rows listed in ``config.extra["zero_rows"]`` set to zero (the specials of
    ``train --zero-specials``; in every word table); no random draw is taken, so every other parameter is as without them."""
    rows = config.extra.get("zero_rows")
    if rows:
        with torch.no_grad():
            for table in word_tables(model):
                table.weight[torch.tensor(rows, dtype=torch.long)] = 0.0
    return model


def with_vectors(model: AttentionModel, config: ModelConfig, vectors: torch.Tensor) -> AttentionModel:
    """``model`` with its word-embedding table set to ``vectors`` (a run trained from pretrained word vectors,
    ``train --vectors``), then the rows of :func:`zero_rows` zeroed; no random draw is taken, so every other parameter
    is as a fresh build left it. Every model a run trains from scratch (the run itself, and the sub-runs of the
    training-based tests) starts this way."""
    table = getattr(model, "embedding", None)
    if not isinstance(table, torch.nn.Embedding) or tuple(table.weight.shape) != tuple(vectors.shape):
        shape = tuple(table.weight.shape) if isinstance(table, torch.nn.Embedding) else "none"
        raise AttnAuditError(f"a {config.model} model's word embedding ({shape}) cannot start from vectors of shape {tuple(vectors.shape)}")
    with torch.no_grad():
        for each in word_tables(model):  # a question table of its own starts from the vectors too
            each.weight.copy_(vectors)
    return zero_rows(model, config)


__all__ = [
    "MODELS",
    "AttentionLayer",
    "AttentionModel",
    "AttentionTrace",
    "Cache",
    "Intervention",
    "ModelConfig",
    "ModelOutput",
    "build_model",
    "with_vectors",
    "zero_rows",
    "detach_weights",
    "evaluation",
    "freeze_to",
    "freeze_uniform",
    "uniform_weights",
]
