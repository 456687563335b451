"""The explained attention rows: the explained layer's, and every layer's and head's over the explained items."""

from __future__ import annotations

import torch
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.explain.registry import (
    check_task,
    hierarchical,
    layer_index,
    reduce_heads,
    takes_run,
    to_items,
)
from attnaudit.models.interface import AttentionLayer, AttentionModel, AttentionTrace, evaluation


def explained_attention(
    model: AttentionModel, batch: Batch, trace: AttentionTrace, layer: int | None = None, head: int | None = None
) -> Tensor:
    """:func:`attention_importance` read from the ``trace`` of a forward pass already made on ``batch``.

    An encoder-decoder explaining its earlier target tokens too (``target_items``): the cross-attention row over
    the source, then the same block's decoder self-attention row over the target (two distributions, side by side)."""
    index = layer_index(model, layer)
    record = trace[index]
    values = reduce_heads(record.weights, record.query_mask, head, explanation_row(model, batch, record))
    if model.target_items and batch.target is not None:
        own = trace[model.block_first_layer(index)]  # the block's self-attention, before its cross
        rows = explanation_row(model, batch, own)
        values = torch.cat([values[:, : batch.tokens.shape[1]], reduce_heads(own.weights, own.query_mask, head, rows)], 1)
    return to_items(values, model, batch, index)


@takes_run
def attention_per_head(model: AttentionModel, batch: Batch, trace: AttentionTrace | None = None) -> Tensor:
    """Attention of every layer and head over the explained items, ``(B, L, H, K)``.

    Mean over real queries. Only layers whose keys are the explained items are included:
    every layer of a Transformer, the one layer of the single-attention classifiers,
    HAN's sentence layer alone (its word layer attends within sentences) and an encoder-decoder's
    cross-attention layers (their keys are the source). ``trace``: that of a
    forward pass already made on ``batch`` (default: one is made).
    """
    check_task(model)
    if trace is None:
        with evaluation(model), torch.no_grad():
            trace = model.rows_forward(batch).trace
    layers = [model.explained_layer % len(trace)] if hierarchical(model) else (model.cross_layers or range(len(trace)))
    stacked = []
    for index in layers:
        record = trace[index]
        rows = explanation_row(model, batch, record)
        heads = [
            to_items(reduce_heads(record.weights, record.query_mask, h, rows), model, batch, index)
            for h in range(record.weights.shape[1])
        ]
        stacked.append(torch.stack(heads, 1))
    return torch.stack(stacked, 1)


def explanation_row(model: AttentionModel, batch: Batch, record: AttentionLayer) -> int | Tensor | None:
    """Which query row of ``record`` explains each instance: the only one where the pass kept one row
    per instance (:attr:`AttentionLayer.rows`), else :meth:`AttentionModel.explanation_rows` of its queries (an
    encoder-decoder's cross-attention: the decoder's)."""
    if record.rows is not None:
        return 0
    return model.explanation_rows(record.query_mask if record.query_mask is not None else batch.mask)
