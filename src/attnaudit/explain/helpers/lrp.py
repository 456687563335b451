"""Relevance by the LRP rules (AttnLRP, CP-LRP) through the model's relevance sites."""

from __future__ import annotations

from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.explain.helpers.gradients import decision_gradient
from attnaudit.explain.registry import check_task
from attnaudit.models.interface import AttentionModel
from attnaudit.models.lrp import relevance_rules


def lrp_relevance(model: AttentionModel, batch: Batch, rule: str) -> Tensor:
    """Input × modified gradient of the predicted logit under ``rule`` (``attnlrp``, ``cp_lrp``),
    summed over the embedding dimension: ``(B, T)`` over the model's embedded tokens."""
    check_task(model)
    with relevance_rules(model, rule):
        embeddings, grad = decision_gradient(model, batch, "logit")
    return (embeddings * grad).sum(-1)
