"""``random``: a seeded random score per item, the baseline any explanation should beat."""

from __future__ import annotations

import torch
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.explain.registry import check_task, explanation, item_mask
from attnaudit.models.interface import AttentionModel


@explanation("random", "uniform random scores in [0, 1), seeded (a baseline)", default=False, order=90, per_example=False)
def random_importance(model: AttentionModel, batch: Batch, seed: int = 0) -> Tensor:
    """Uniform random scores ``(B, K)`` from a CPU generator seeded with ``seed``, 0 at padding.

    The same seed and batch shape give the same scores, on any device.
    """
    check_task(model)
    mask = item_mask(model, batch)
    generator = torch.Generator().manual_seed(seed)
    scores = torch.rand(mask.shape, generator=generator, dtype=torch.float64)
    return scores.to(device=mask.device, dtype=torch.float32) * mask
