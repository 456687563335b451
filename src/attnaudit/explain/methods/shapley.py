"""``shapley``: Shapley value sampling over the features (tokens or segments), seeded (Castro et al. 2009; Captum's
``ShapleyValueSampling``)."""

from __future__ import annotations

import torch
from torch import Tensor

from attnaudit.bounds import perturbation_samples
from attnaudit.data.types import Batch
from attnaudit.explain.helpers.perturbation import DEFAULT_BASELINE, Perturber, baseline_reason, perturbing, seeded, spread
from attnaudit.explain.registry import explanation
from attnaudit.models.interface import AttentionModel

_PERMUTATIONS_PER_CHUNK_ELEMENTS = 1 << 22
"""Coalition-mask elements (permutations × features²) evaluated together."""


@explanation(
    "shapley", "Shapley value sampling: each feature's mean marginal change of ŷ over random orders (Captum's ShapleyValueSampling)",
    ("prediction",), default=False, order=60, grouped=True,
    settings_check=lambda model, settings: baseline_reason(model, settings["baseline"]),
)
def shapley(model: AttentionModel, batch: Batch, samples: int = 25, seed: int = 0, baseline: str = DEFAULT_BASELINE) -> Tensor:
    """Shapley value sampling ``(B, K)``: for each of ``samples`` random orders of an instance's features (its
    groups: tokens, or segments), the features are added one by one to the empty coalition (every feature
    perturbed by ``baseline``: deleted by default, or replaced by a token or zero embeddings) and each is credited
    with the change of ``ŷ`` it makes; a feature's score is the mean over the orders, carried by every item of it.
    The scores of an instance sum to ``ŷ(x) − ŷ(every feature perturbed)`` exactly (efficiency). The orders are
    ``torch.randperm`` draws after ``torch.manual_seed(seed)``, per instance: Captum's for that instance alone.
    Every coalition of a batch runs in a few batched passes (a causal decoder continuing from the kept prefix)."""
    with perturbing(model, batch, baseline) as perturber:
        per_group = []
        for b, count in enumerate(perturber.counts):
            perturbation_samples(samples, count)
            per_group.append(_instance(perturber, b, count, samples, seed) if count else torch.zeros(0))
    return spread(model, batch, perturber.groups, per_group)


def _instance(perturber: Perturber, b: int, count: int, samples: int, seed: int) -> Tensor:
    """One instance's ``count`` Shapley values from ``samples`` orders, evaluated in chunks of orders."""
    evaluate = perturber.values
    with seeded(seed):
        orders = [torch.randperm(count) for _ in range(samples)]
    empty = evaluate(torch.tensor([b]), torch.zeros(1, count, dtype=torch.bool))
    total = torch.zeros(count, dtype=torch.float64)
    per_chunk = max(1, _PERMUTATIONS_PER_CHUNK_ELEMENTS // (count * count))
    steps = torch.arange(count)
    for at in range(0, samples, per_chunk):
        chunk = torch.stack(orders[at : at + per_chunk])  # (P, M): the order of each permutation
        rank = torch.argsort(chunk, 1)  # (P, M): each feature's place in its order
        present = rank[:, None, :] <= steps[None, :, None]  # (P, M steps, M features): the first s+1 added
        value = evaluate(torch.full((present.shape[0] * count,), b), present.reshape(-1, count))
        value = value.reshape(-1, count)  # (P, step)
        before = torch.cat([empty.expand(len(value), 1), value[:, :-1]], 1)
        total.scatter_add_(0, chunk.reshape(-1), (value - before).reshape(-1))
    return total / samples
