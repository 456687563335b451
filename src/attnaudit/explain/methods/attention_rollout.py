"""``rollout``: attention rollout through every layer up to the explained one (Abnar & Zuidema 2020),
read at the explanation query; the algorithm is :func:`attnaudit.algorithms.attention_graph.rollout`."""

from __future__ import annotations

import torch
from torch import Tensor

from attnaudit.algorithms.attention_graph import StreamingRollout, rollout
from attnaudit.data.types import Batch
from attnaudit.explain.helpers.rollout import explained_record, layer_weights
from attnaudit.explain.registry import explanation, on_items, query_row
from attnaudit.models.interface import AttentionLayer, AttentionModel, language_model


def streamed_rollout(model: AttentionModel, batch: Batch, index: int) -> tuple[Tensor, AttentionLayer]:
    """Rollout through layers ``0 … index`` folded in as the model runs (models that :attr:`~AttentionModel.streams_layers`),
    ``(B,T,T)``, and layer ``index``'s record: one layer's weights in memory at a time, not all of them."""
    rolled = StreamingRollout()

    def fold(layer: int, record: AttentionLayer) -> None:
        if layer <= index:
            rolled.add(record.weights, record.mask)

    with torch.no_grad():
        streaming = language_model(model, "streamed rollout")  # the model that streams its layers
        trace = streaming.decode(streaming.encode(batch), keep_layers=[index], on_layer=fold).trace
    return rolled.result, trace[0]




@explanation(
    "rollout", "attention rollout through the layers, residual ½I, heads averaged (Abnar & Zuidema 2020)",
    ("self_attention",), order=50,
)
def rollout_importance(model: AttentionModel, batch: Batch) -> Tensor:
    """Attention rollout through every layer (Abnar & Zuidema 2020) read at the explanation query, ``(B,K)``.

    Heads are averaged and the residual connection counted with weight 0.5, as in the
    paper; the row is ``[CLS]``'s for Hugging Face encoders, the mean over real queries for
    our mean-pooled Transformer and the last real token's for decoders (whose layers are
    folded in one at a time, :func:`streamed_rollout`).
    """
    if model.streams_layers:
        rolled, record = streamed_rollout(model, batch, model.explained_layer % model.num_attention_layers)
    else:
        trace, index, record = explained_record(model, batch)
        rolled = rollout(layer_weights(trace, index), mask=record.mask)[:, -1]
    return on_items(model, batch, query_row(model, rolled, record.query_mask))
