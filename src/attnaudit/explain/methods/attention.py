"""``attention``: the explained attention itself, mean over heads and real queries (or the explanation row)."""

from __future__ import annotations

import torch
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.explain.helpers.attention import explained_attention
from attnaudit.explain.registry import (
    check_task,
    explanation,
)
from attnaudit.models.interface import AttentionModel, evaluation


@explanation("attention", "the explained attention layer's weights (mean over heads; the explanation query's row)", order=10,
             target_side=True, reads_rows=True)
def attention_importance(model: AttentionModel, batch: Batch, layer: int | None = None, head: int | None = None) -> Tensor:
    """The explained attention ``(B, K)``: mean over heads (or ``head``) and real queries.

    ``layer`` defaults to ``model.explained_layer`` (the last one for Transformers). HAN's
    word layer (``layer=0``) gives ``(B, S*W)``: the word weights within each sentence.
    """
    check_task(model)
    with evaluation(model), torch.no_grad():
        return explained_attention(model, batch, model.rows_forward(batch).trace, layer, head)






