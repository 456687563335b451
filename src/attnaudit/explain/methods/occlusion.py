"""``occlusion``: windowed occlusion over the features (tokens or segments) (Zeiler & Fergus 2014; Captum's ``Occlusion``)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnaudit.bounds import OCCLUSION_WINDOW, occlusion_window
from attnaudit.data.types import Batch
from attnaudit.explain.helpers.perturbation import DEFAULT_BASELINE, baseline_reason, perturbing, spread
from attnaudit.explain.registry import explanation
from attnaudit.models.interface import AttentionModel


def _settings_reason(model: AttentionModel, settings: dict[str, object]) -> str | None:
    return baseline_reason(model, str(settings["baseline"]))


@explanation(
    "occlusion", "windowed occlusion: mean drop of ŷ when a window of consecutive features is perturbed (Captum's Occlusion)",
    ("prediction",), default=False, order=63, grouped=True, settings_check=_settings_reason,
)
def occlusion(
    model: AttentionModel, batch: Batch, window: int = OCCLUSION_WINDOW, stride: int = 1, baseline: str = DEFAULT_BASELINE,
) -> Tensor:
    """Windowed occlusion ``(B, K)``: windows of ``window`` consecutive features (an instance's groups in order:
    tokens, or segments; at most all of them) starting every ``stride`` features (the last one cut at the end, as
    Captum's are), each perturbed as one unit by ``baseline`` (deleted by default, or a token, or zero
    embeddings); a feature's score is the mean of ``ŷ(x) − ŷ(x with the window perturbed)`` over the windows
    covering it, carried by every item of it. Every window of a batch runs in a few batched passes."""
    occlusion_window(window, stride)
    with perturbing(model, batch, baseline) as perturber:
        rows, masks, spans = [], [], []
        for b, count in enumerate(perturber.counts):
            width = min(window, count)
            starts = range(0, count, stride)[: math.ceil((count - width) / stride) + 1] if count else range(0)
            for start in starts:
                covered = torch.zeros(max(perturber.counts), dtype=torch.bool)
                covered[start : min(start + width, count)] = True
                rows.append(b)
                masks.append(covered)
                spans.append(covered[:count])
        values = perturber.values(torch.tensor(rows, dtype=torch.long), ~torch.stack(masks)) if rows else torch.zeros(0)
        per_group = []
        at = 0
        for b, count in enumerate(perturber.counts):
            total, covers = torch.zeros(count, dtype=torch.float64), torch.zeros(count, dtype=torch.float64)
            while at < len(rows) and rows[at] == b:
                total += spans[at].double() * (perturber.full[b] - values[at])
                covers += spans[at].double()
                at += 1
            per_group.append(total / covers.clamp_min(1))
    return spread(model, batch, perturber.groups, per_group)
