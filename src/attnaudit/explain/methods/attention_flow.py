"""``flow``: attention flow through every layer up to the explained one (Abnar & Zuidema 2020), read
at the explanation query; the max-flow algorithm is :func:`attnaudit.algorithms.attention_graph.flow`. Costly (about
``T^4`` per instance), so not among the default explanations."""

from __future__ import annotations

import torch
from torch import Tensor

from attnaudit.algorithms.attention_graph import flow
from attnaudit.data.types import Batch
from attnaudit.explain.helpers.rollout import explained_record, layer_weights
from attnaudit.explain.registry import explanation, on_items, query_row
from attnaudit.models.interface import AttentionModel


@explanation(
    "flow", "attention flow (max-flow) through the layers, residual ½I, heads averaged (Abnar & Zuidema 2020)",
    ("self_attention",), default=False, order=70,
)
def flow_importance(model: AttentionModel, batch: Batch) -> Tensor:
    """Maximum flow from each input token to the explanation query's node of the explained layer, ``(B,K)``.

    Heads are averaged and the residual counted with weight 0.5, as for ``rollout``; the raw
    max-flow values (A&Z divide each row by its sum, which keeps the ranking). Only the rows read
    at the explanation query are solved (:func:`~attnaudit.algorithms.attention_graph.flow`'s ``sinks``).
    """
    trace, index, record = explained_record(model, batch)
    query_mask = record.mask if record.query_mask is None else record.query_mask
    rows = model.explanation_rows(query_mask)
    if rows is None:
        sinks = query_mask.bool()
    else:
        query = torch.as_tensor(rows, device=query_mask.device).expand(query_mask.shape[0])
        sinks = torch.nn.functional.one_hot(query, query_mask.shape[1]).bool()
    flowed = flow(layer_weights(trace, index), mask=record.mask, sinks=sinks)[:, -1]
    return on_items(model, batch, query_row(model, flowed, record.query_mask))
