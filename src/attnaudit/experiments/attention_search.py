"""The per-instance adversarial attention search (Jain & Wallace 2019, §4.2.2), shared by the tests that ask it.

The ``adversarial`` test asks it of each instance's decision and the ``generation`` test of each generated
token; the objective, the optimiser and the recheck are the same (see :mod:`attnaudit.experiments.adversarial`
for the objective). Not a test itself: tests never import each other, so what two tests share lives here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from attnaudit.algorithms.metrics import jsd, output_change, row_mean
from attnaudit.data.types import Batch
from attnaudit.experiments.common.passes import Explained, prepare, take_rows
from attnaudit.experiments.common.seeding import seeded_generator
from attnaudit.models.interface import AttentionModel, Intervention


@dataclass
class Search:
    """Settings of the adversarial search (see the module docstring for the objective)."""

    adversaries: int = 5
    steps: int = 500
    lr: float = 0.01
    penalty: float = 500.0
    epsilon: float = 0.01
    report_epsilon: float = 0.01


def initial_logits(key_mask: Tensor, query_rows: Tensor, adversaries: int, heads: int, generator: torch.Generator) -> Tensor:
    """Starting logits ``(A,H,Q,K)``: standard normal at real keys of real query rows, 0 elsewhere.

    Drawn over the real items only, so an instance starts from the same point alone or padded.
    """
    k, q = key_mask.shape[0], query_rows.shape[0]
    real = key_mask.nonzero().squeeze(-1)
    rows = query_rows.nonzero().squeeze(-1)
    theta = torch.zeros(adversaries, heads, q, k)
    theta[:, :, rows[:, None], real] = torch.randn(adversaries, heads, rows.numel(), real.numel(), generator=generator)
    return theta


def adversary_weights(theta: Tensor, key_mask: Tensor, query_rows: Tensor, original: Tensor) -> Tensor:
    """Distributions ``(N,A,H,Q,K)`` from logits: softmax over real keys; padding query rows keep the original."""
    keys = key_mask[:, None, None, None, :]
    weights = theta.masked_fill(~keys, float("-inf")).softmax(-1)
    return torch.where(query_rows[:, None, None, :, None], weights, original[:, None])


def differentiable_jsd(p: Tensor, q: Tensor) -> Tensor:
    """JSD in nats along the last axis, with finite gradients at zero probabilities.

    Same value as :func:`attnaudit.algorithms.metrics.jsd` (used for everything reported), but that one's
    ``xlogy`` has an infinite derivative at exact zeros (padding, softmax underflow), which
    the softmax backward turns into NaN (0·∞); clamping inside the logarithms keeps every
    ``0·log 0`` term at 0 with a finite derivative.
    """
    tiny = torch.finfo(p.dtype).tiny
    m = 0.5 * (p + q)
    log_m = m.clamp_min(tiny).log()
    kl_pm = (p * (p.clamp_min(tiny).log() - log_m)).sum(-1)
    kl_qm = (q * (q.clamp_min(tiny).log() - log_m)).sum(-1)
    return 0.5 * (kl_pm + kl_qm)


def divergence(weights: Tensor, original: Tensor, query_rows: Tensor, measure: Callable[[Tensor, Tensor], Tensor] = jsd) -> Tensor:
    """JSD of each adversary from the original ``(N,A)``, averaged over heads and real query rows."""
    return row_mean(measure(weights, original[:, None]), query_rows)


def pairwise_divergence(weights: Tensor, query_rows: Tensor) -> Tensor:
    """Mean JSD over the pairs ``i < j`` of an instance's adversaries ``(N,)`` (0 for one adversary)."""
    count = weights.shape[1]
    if count < 2:
        return weights.new_zeros(weights.shape[0])
    pairs = row_mean(differentiable_jsd(weights[:, :, None], weights[:, None, :]), query_rows)
    upper = torch.triu_indices(count, count, 1, device=weights.device)
    return pairs[:, upper[0], upper[1]].mean(-1)


def objective(div: Tensor, change: Tensor, pair: Tensor, epsilon: float, penalty: float) -> Tensor:
    """Per-instance loss ``(N,)``: −ΣJSD + λ·ΣReLU(Δŷ − ε) − mean pairwise JSD."""
    return -div.sum(-1) + penalty * torch.relu(change - epsilon).sum(-1) - pair


def max_valid_jsd(div: Tensor, change: Tensor, bound: float) -> tuple[Tensor, Tensor]:
    """Largest JSD among adversaries with ``Δŷ ≤ bound`` per instance (NaN if none) and their count.

    A NaN change is never within the bound.
    """
    valid = change <= bound
    best = div.masked_fill(~valid, float("-inf")).max(-1).values
    return torch.where(valid.any(-1), best, torch.full_like(best, float("nan"))), valid.sum(-1)


Decoder = Callable[[Tensor], Tensor]
"""``decode(weights (N,A,H,Q,K)) -> probs (N,A,C)``: the model's output under adversarial attention."""


def optimise(theta0: Tensor, decode: Decoder, explained: Explained, search: Search) -> tuple[Tensor, int]:
    """Adam on the logits; returns, per adversary, the logits to report and the number of decodes.

    Every step evaluates the current adversaries; the one reported is the iterate with the
    largest JSD among those within ``report_epsilon`` (the soft penalty lets the final iterate
    hover just above ε), or the final iterate when none was. The caller re-checks the bound.
    """
    original, key_mask, query_rows = explained.reported, explained.key_mask, explained.query_rows
    probs0 = explained.probs[:, None]
    theta = theta0.clone().requires_grad_(True)
    optimizer = torch.optim.Adam([theta], lr=search.lr)
    best = theta0.clone()
    best_div = torch.full(theta0.shape[:2], float("-inf"), device=theta0.device)
    calls = 0
    for step in range(search.steps + 1):
        final = step == search.steps
        with torch.set_grad_enabled(not final):
            weights = adversary_weights(theta, key_mask, query_rows, original)
            probs = decode(weights)
            calls += 1
            change = output_change(probs, probs0.expand_as(probs))
            div = divergence(weights, original, query_rows, differentiable_jsd)
        with torch.no_grad():  # torch.where, not boolean indexing: no sync with the host per step
            improved = (change <= search.report_epsilon) & (div > best_div)
            best = torch.where(improved[..., None, None, None], theta.detach(), best)
            best_div = torch.where(improved, div.detach(), best_div)
        if final:
            break
        pair = pairwise_divergence(weights, query_rows)
        loss = objective(div, change, pair, search.epsilon, search.penalty).sum()
        optimizer.zero_grad()
        loss.backward(inputs=[theta])
        optimizer.step()
    never = torch.isinf(best_div)
    return torch.where(never[..., None, None, None], theta.detach(), best), calls


@dataclass
class AdversarialOutcome:
    """One batch: the reported adversaries ``weights`` (N,A,H,Q,K), their ``jsd`` / ``change`` (N,A), rechecked."""

    explained: Explained
    weights: Tensor
    jsd: Tensor
    change: Tensor
    decode_calls: int


def key_distribution(weights: Tensor, query_rows: Tensor, key_mask: Tensor) -> list[float]:
    """One instance's attention ``(H,Q,K)`` as one distribution over its real keys: the mean over
    heads and real query rows (what the report's explorer draws beside the original)."""
    rows = query_rows.to(weights.dtype)
    mean = (weights.mean(0) * rows[:, None]).sum(0) / rows.sum().clamp_min(1.0)
    return [round(float(v), 5) for v in mean[key_mask.bool()].tolist()]


def recheck(theta: Tensor, decode: Decoder, explained: Explained) -> tuple[Tensor, Tensor, Tensor]:
    """Recompute adversaries, their JSD and output change with a fresh decode (no gradient)."""
    with torch.no_grad():
        weights = adversary_weights(theta, explained.key_mask, explained.query_rows, explained.reported)
        probs = decode(weights)
        change = output_change(probs, explained.probs[:, None].expand_as(probs))
        return weights, divergence(weights, explained.reported, explained.query_rows), change


def initial_batch(explained: Explained, seed: int, indices: Sequence[int], adversaries: int) -> Tensor:
    """Starting logits ``(N,A,H,Q,K)`` of a batch, each instance from its own seeded generator."""
    heads = explained.reported.shape[1]
    key_mask, query_rows = explained.key_mask.cpu(), explained.query_rows.cpu()
    theta = [
        initial_logits(key_mask[i], query_rows[i], adversaries, heads, seeded_generator(seed, index))
        for i, index in enumerate(indices)
    ]
    return torch.stack(theta).to(explained.key_mask.device)


def search_batch(
    model: AttentionModel, batch: Batch, layer: int, search: Search, seed: int, indices: Sequence[int]
) -> AdversarialOutcome:
    """Adversaries for every instance of ``batch``: encode once, one decode per step for all of them.

    ``indices`` (positions in the evaluation set) and ``seed`` fix each instance's start.
    """
    return search_explained(model, prepare(model, batch, [layer]), layer, search, seed, indices)


def search_explained(
    model: AttentionModel, explained: Explained, layer: int, search: Search, seed: int, indices: Sequence[int]
) -> AdversarialOutcome:
    """:func:`search_batch` on a prepared batch whose last layer is ``layer`` (its query rows: the rows searched)."""
    size, adversaries = explained.size, search.adversaries
    _, heads, q, k = explained.reported.shape
    rows = torch.arange(size, device=explained.key_mask.device).repeat_interleave(adversaries)
    cache = take_rows(explained.cache, rows, size)

    def decode(weights: Tensor) -> Tensor:
        out = model.decode(cache, [Intervention(layer=layer, weights=weights.reshape(size * adversaries, heads, q, k))])
        return out.probs.view(size, adversaries, -1)

    theta, calls = optimise(initial_batch(explained, seed, indices, adversaries), decode, explained, search)
    weights, div, change = recheck(theta, decode, explained)
    return AdversarialOutcome(explained, weights, div, change, calls + 1)
