"""The unperturbed forward pass's trace and its layers' attention weights (rollout, flow and the context-mixing methods)."""

from __future__ import annotations

from typing import Any

import torch

from attnaudit.data.types import Batch
from attnaudit.models.interface import AttentionLayer, AttentionModel, AttentionTrace


def explained_record(model: AttentionModel, batch: Batch) -> tuple[AttentionTrace, int, AttentionLayer]:
    """(trace, explained layer index, that layer's record) of an unperturbed forward pass."""
    with torch.no_grad():
        trace = model(batch).trace
    index = model.explained_layer % len(trace)
    return trace, index, trace[index]


def layer_weights(trace: AttentionTrace, index: int) -> list[Any]:
    """The attention weights of layers ``0 … index``, each ``(B,H,T,T)``."""
    return [layer.weights for layer in list(trace.layers)[: index + 1]]
