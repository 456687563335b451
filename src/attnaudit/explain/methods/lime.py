"""``lime``: LIME over the features (tokens or segments), seeded (Ribeiro et al. 2016; Captum's ``Lime``)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnaudit.bounds import perturbation_samples
from attnaudit.data.types import Batch
from attnaudit.explain.helpers.perturbation import (
    DEFAULT_BASELINE,
    Perturber,
    baseline_reason,
    perturbing,
    seeded,
    spread,
    weighted_linear_fit,
)
from attnaudit.explain.registry import explanation
from attnaudit.models.interface import AttentionModel

KERNEL_WIDTH = 1.0
"""The width of the exponential kernel on the cosine distance (Captum's default)."""


@explanation(
    "lime", "LIME: a locally weighted linear fit of ŷ on random coalitions of the features (Captum's Lime, least squares)",
    ("prediction",), default=False, order=62, grouped=True,
    settings_check=lambda model, settings: baseline_reason(model, settings["baseline"]),
)
def lime(model: AttentionModel, batch: Batch, samples: int = 200, seed: int = 0, baseline: str = DEFAULT_BASELINE) -> Tensor:
    """LIME ``(B, K)``: ``samples`` coalitions of an instance's features (its groups: tokens, or segments), each
    feature kept with probability ½ (``torch.bernoulli`` draws after ``torch.manual_seed(seed)``, per instance:
    Captum's), the others perturbed by ``baseline`` (deleted by default, or a token, or zero embeddings); each
    coalition weighted by ``exp(−d²/2w²)``, ``d`` the cosine distance between the items kept (1 or 0 per item)
    and the whole input (all ones), ``w`` = :data:`KERNEL_WIDTH` (Captum's default similarity); a feature's score
    is its coefficient in the weighted least-squares fit ``ŷ ≈ b + Σ_i c_i z_i`` (Captum's ``Lime`` with
    ``SkLearnLinearRegression``; its default is a Lasso), carried by every item of it."""
    with perturbing(model, batch, baseline) as perturber:
        per_group = []
        for b, count in enumerate(perturber.counts):
            perturbation_samples(samples, count, regression=True)
            per_group.append(_instance(perturber, b, count, samples, seed) if count else torch.zeros(0))
    return spread(model, batch, perturber.groups, per_group)


def coalitions(count: int, samples: int, seed: int) -> Tensor:
    """``(samples, count)`` bool: Captum's LIME draws (a fair coin per feature) after ``torch.manual_seed(seed)``."""
    with seeded(seed):
        return torch.stack([torch.bernoulli(torch.ones(1, count) * 0.5)[0].bool() for _ in range(samples)])


def similarity(present: Tensor, groups: Tensor) -> Tensor:
    """``(S,)`` float64: each coalition's kernel weight from the cosine between its kept items and all items
    (``groups``: the instance's items' group numbers)."""
    items = groups[groups >= 0].cpu()
    kept = present[:, items].double().sum(1)
    cosine = (kept / (math.sqrt(len(items)) * kept.sqrt()).clamp_min(1e-8)).where(kept > 0, torch.zeros_like(kept))
    return torch.exp(-((1 - cosine) ** 2) / (2 * KERNEL_WIDTH**2))


def _instance(perturber: Perturber, b: int, count: int, samples: int, seed: int) -> Tensor:
    present = coalitions(count, samples, seed)
    values = perturber.values(torch.full((len(present),), b), present)
    return weighted_linear_fit(present.double(), values, similarity(present, perturber.groups[b])).float()
