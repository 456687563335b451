"""``norms``: Kobayashi et al. (2020)'s head-summed contribution ``‖Σ_h α^h_ij f_h(x_j)‖`` of the
explained layer, read at the explanation query; the norm analysis itself lives here too."""

from __future__ import annotations

import torch
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.explain.helpers.norms import layer_norms
from attnaudit.explain.helpers.rollout import explained_record
from attnaudit.explain.registry import explanation, on_items, query_row
from attnaudit.models.interface import AttentionModel


@explanation(
    "norms", "‖Σ_h α f_h(x)‖ of the explained layer, the head-summed contribution norm (Kobayashi et al. 2020)",
    ("value_output",), order=55,
)
def norm_importance(model: AttentionModel, batch: Batch) -> Tensor:
    """Kobayashi et al.'s head-summed contribution ``‖Σ_h α^h_ij f_h(x_j)‖`` of the explained layer, ``(B,K)``."""
    _, index, record = explained_record(model, batch)
    with torch.no_grad():
        norms = layer_norms(model, record, index).summed_norm
    return on_items(model, batch, query_row(model, norms, record.query_mask))
