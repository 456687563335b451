"""``kernel_shap``: KernelSHAP over the features (tokens or segments), seeded (Lundberg & Lee 2017; Captum's ``KernelShap``;
shap's ``KernelExplainer`` when the samples cover every coalition)."""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.distributions.categorical import Categorical

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

ENDPOINT_WEIGHT = 1e6
"""The weight of the all-kept and all-perturbed coalitions (Captum's; in theory infinite: the fit must meet both ends)."""


@explanation(
    "kernel_shap", "KernelSHAP: a linear fit of ŷ on random coalitions drawn by the Shapley kernel (Captum's KernelShap)",
    ("prediction",), default=False, order=61, grouped=True,
    settings_check=lambda model, settings: baseline_reason(model, settings["baseline"]),
)
def kernel_shap(model: AttentionModel, batch: Batch, samples: int = 200, seed: int = 0, baseline: str = DEFAULT_BASELINE) -> Tensor:
    """KernelSHAP ``(B, K)``: ``samples`` coalitions of an instance's features (its groups: tokens, or segments)
    — every feature kept, every one perturbed (by ``baseline``: deleted by default, or a token, or zero
    embeddings), then coalitions whose size ``k`` is drawn with probability ∝ ``(M−1)/(k(M−k))`` and members
    uniformly — and the least-squares fit ``ŷ ≈ b + Σ_i c_i z_i`` on them (the two end coalitions weighted
    :data:`ENDPOINT_WEIGHT`, the others 1); a feature's score is its coefficient, carried by every item of it.
    The draws are Captum's (``Categorical``, ``torch.randn``, ``kthvalue``) after ``torch.manual_seed(seed)``,
    per instance; one feature alone gets ``ŷ(x) − ŷ(perturbed)``. When ``samples`` covers every coalition
    (``samples ≥ 2^M`` for ``M`` features) they are all run once instead, each weighted by the Shapley kernel, and
    the fit is the exact Shapley values (:func:`exact_shapley`), as shap's ``KernelExplainer`` enumerates then;
    Captum keeps drawing at random there."""
    with perturbing(model, batch, baseline) as perturber:
        per_group = []
        for b, count in enumerate(perturber.counts):
            perturbation_samples(samples, count, regression=True)
            per_group.append(_instance(perturber, b, count, samples, seed) if count else torch.zeros(0))
    return spread(model, batch, perturber.groups, per_group)


def coalitions(count: int, samples: int, seed: int) -> Tensor:
    """``(samples, count)`` bool: Captum's KernelSHAP draws for ``count`` features after ``torch.manual_seed(seed)``."""
    drawn = [torch.ones(count, dtype=torch.bool), torch.zeros(count, dtype=torch.bool)][:samples]
    if samples > 2:
        sizes = torch.arange(count, dtype=torch.float)
        probs = torch.tensor(count - 1) / (sizes * (count - sizes))
        probs[0] = 0.0
        choose = Categorical(probs)
        with seeded(seed):
            for _ in range(samples - 2):
                size = choose.sample()
                values = torch.randn(1, count)
                threshold = torch.kthvalue(values, count - size).values.item()
                drawn.append((values > threshold)[0])
    return torch.stack(drawn)


def exact_shapley(perturber: Perturber, b: int, count: int) -> Tensor:
    """``(count,)`` float32: the exact Shapley values of instance ``b``'s features from all ``2^count`` coalitions
    (``φ_i = Σ_{S∌i} |S|!(M−|S|−1)!/M! · (v(S∪{i}) − v(S))``), the solution KernelSHAP's fit reaches with every
    coalition under the Shapley kernel and the efficiency constraint."""
    codes = torch.arange(1 << count)
    present = ((codes[:, None] >> torch.arange(count)) & 1).bool()
    values = perturber.values(torch.full((len(codes),), b), present)
    sizes = present.sum(1)
    weight = torch.tensor([math.factorial(s) * math.factorial(count - s - 1) / math.factorial(count) for s in range(count)],
                          dtype=torch.float64)
    out = torch.empty(count, dtype=torch.float64)
    for i in range(count):
        without = codes[~present[:, i]]
        out[i] = (weight[sizes[without]] * (values[without | (1 << i)] - values[without])).sum()
    return out.float()


def _instance(perturber: Perturber, b: int, count: int, samples: int, seed: int) -> Tensor:
    if count < 63 and samples >= 1 << count:  # every coalition fits the budget: enumerate them (exact)
        return exact_shapley(perturber, b, count)
    if count == 1:  # one feature: the whole change (Captum's size distribution is empty there)
        ends = perturber.values(torch.tensor([b, b]), torch.tensor([[True], [False]]))
        return (ends[:1] - ends[1:]).float()
    present = coalitions(count, samples, seed)
    values = perturber.values(torch.full((len(present),), b), present)
    full = present.all(1) | ~present.any(1)
    weights = torch.where(full, torch.tensor(ENDPOINT_WEIGHT, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64))
    return weighted_linear_fit(present.double(), values, weights).float()
