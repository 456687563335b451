"""ERASER faithfulness metrics (DeYoung et al. 2020) and the batched perturbations behind them.

For an explanation's scores over the items of one instance (tokens; HAN: sentences), with the
model's predicted class ``ŷ`` and its probability ``p(ŷ|x)`` on the unperturbed input:

* **comprehensiveness** at a bin ``f``: ``p(ŷ|x) − p(ŷ|x without its top-k items)``; high =
  the items the explanation ranks first are the ones the decision needs;
* **sufficiency** at ``f``: ``p(ŷ|x) − p(ŷ|only the top-k items)``; low = those items alone
  keep the decision;
* **AOPC**: the mean of either over the bins (default 1, 5, 10, 20, 50 % of the items);
* **deletion / insertion curves**: ``p(ŷ)`` as the top fraction is removed / kept, over a grid
  of fractions; their areas are the means over the grid (lower deletion, higher insertion =
  more faithful).

``k = ⌈f·n⌉`` of the ``n`` removable items, at least 1 and at most ``n − 1``, so neither
perturbation removes the whole input or nothing. Items are ranked by their score as given
(signed methods: most supporting first), ties by position. Special tokens of Hugging Face
tokenizers (``[CLS]``, ``[SEP]``) are never removed, and padding is never touched.

Two removal modes: ``delete`` removes the items (later ones move up), ``mask`` replaces every
token of a removed item by a filler (:func:`filler`): ``[MASK]`` for Hugging Face encoders,
``<unk>`` for attnaudit's own models (a trained embedding; ``<pad>`` would be a zero vector).

Every perturbed input of a batch (all methods, bins, both kinds) is built at once, identical
ones are run once, and they go through the model in length-sorted chunks
(:func:`perturbed_probs`). The other functions are pure: they take tensors or arrays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from scipy import stats
from torch import Tensor

from attnaudit.algorithms.metrics import kendall_tau, rank_items, top_items
from attnaudit.data.batching import length_groups
from attnaudit.data.types import Batch
from attnaudit.explain.helpers.features import group_members
from attnaudit.explain.helpers.items import compact_items
from attnaudit.explain.registry import first_items, hierarchical, item_groups, item_mask
from attnaudit.models.interface import AttentionModel, evaluation

BINS = (1.0, 5.0, 10.0, 20.0, 50.0)
"""DeYoung et al.'s AOPC bins, percent of the items."""
MODES = ("delete", "mask")
Mode = Literal["delete", "mask"]
UNK_ID = 1
"""``<unk>`` in every attnaudit vocabulary (:class:`attnaudit.data.vocab.Vocab`)."""
# Activation elements per forward pass of perturbed inputs (as in explain/methods/loo.py).
_PASS_ELEMENTS = 1 << 21
# A model pass costs a fixed overhead (Python and one kernel call per module) beside its arithmetic, which grows with
# positions × width² (per layer, both): on the 384-wide MiniLM (2 threads) a pass of 5 rows of 3 tokens took 11 ms,
# what about 110 positions of work take, and letting passes of up to 512 positions pad freely made the ferret
# benchmark's perturbed inputs 9 % faster (0.75 s against 0.82 s; up to 256: 0.78 s, 1024: 0.77 s). Counted in
# positions × width², so a wider model's passes grow less (4096 wide: 4 positions).
_PASS_OVERHEAD = 512 * 384**2


# --------------------------------------------------------------------------- which items, how many


def top_count(n: Tensor, percent: float) -> Tensor:
    """``k = ⌈percent/100 · n⌉`` clipped to ``[1, n − 1]`` per instance, ``(B,)`` (0 where ``n < 2``).

    Rounded to 9 decimals before the ceiling, so ``10 % of 30`` is 3, not 4.
    """
    exact = torch.round(n.to(torch.float64) * (percent / 100.0) * 1e9) / 1e9
    k = torch.ceil(exact).long()
    return torch.minimum(k.clamp_min(1), (n - 1).clamp_min(0))


def removable_items(model: AttentionModel, batch: Batch) -> Tensor:
    """``(B,K)`` True at the items a perturbation may remove: the real items
    (:func:`~attnaudit.explain.item_mask`) without a Hugging Face tokenizer's special tokens; with segments, the first
    item of each segment, which stands for it (its score is the segment's; :func:`removed_with` removes it whole)."""
    mask = item_mask(model, batch)
    tokenizer = model.tokenizer
    special = getattr(tokenizer, "all_special_ids", None)
    if special and not hierarchical(model):
        ids = torch.tensor(sorted(set(special)), device=batch.tokens.device)
        mask = mask & ~torch.isin(batch.tokens[:, : mask.shape[1]], ids)
    groups = item_groups(model, batch)
    return mask if groups is None else mask & first_items(groups.to(mask.device))


def removed_with(groups: Tensor | None, chosen: Tensor) -> Tensor:
    """``chosen`` ``(B,K)`` (among :func:`removable_items`) with, under segments (``groups``:
    :func:`~attnaudit.explain.registry.item_groups`), every other item of each chosen segment: what removing those
    features removes."""
    return chosen if groups is None else group_members(chosen, groups.to(chosen.device))


def filler(model: AttentionModel) -> tuple[int, str]:
    """The token id (and its name) that ``mask`` mode puts in place of a removed item:
    the tokenizer's mask token (``[MASK]``), else its unknown token, else padding, for Hugging
    Face models; ``<unk>`` for attnaudit's own models."""
    tokenizer = model.tokenizer
    if tokenizer is None:
        return UNK_ID, "<unk>"
    for name in ("mask_token", "unk_token", "pad_token"):
        token_id = getattr(tokenizer, f"{name}_id", None)
        if token_id is not None:
            return int(token_id), str(getattr(tokenizer, name))
    return model.config.pad_id, "padding"


# --------------------------------------------------------------------------- perturbed inputs


def masked_batch(batch: Batch, rows: Tensor, keep: Tensor, items: Tensor, fill_id: int) -> Batch:
    """Instances ``rows`` of ``batch`` with every token of an item in ``items & ~keep`` replaced by
    ``fill_id``; masks, lengths and the query unchanged (HAN: a removed sentence's words)."""
    tokens = batch.tokens[rows]
    drop = items[rows] & ~keep
    if tokens.dim() == 3:
        drop = drop[:, :, None] & batch.mask[rows].bool()
    else:
        drop = torch.nn.functional.pad(drop, (0, tokens.shape[1] - drop.shape[1]))
    pick = None if batch.features is None else batch.features[rows]
    return Batch(
        tokens=tokens.masked_fill(drop, fill_id),
        mask=batch.mask[rows],
        features=pick,
        query=None if batch.query is None else batch.query[rows],
        query_mask=None if batch.query_mask is None else batch.query_mask[rows],
    )


def perturbed(model: AttentionModel, batch: Batch, rows: Tensor, keep: Tensor, mode: Mode, fill_id: int) -> Batch:
    """The inputs of instances ``rows`` keeping only the items in ``keep`` ``(R,K)``: deleted or masked."""
    items = item_mask(model, batch)
    if mode == "delete":
        return compact_items(batch, rows, keep & items[rows], model.config.pad_id)
    return trimmed(masked_batch(batch, rows, keep, items, fill_id))


def trimmed(batch: Batch) -> Batch:
    """``batch`` without the trailing positions that are padding in every row (2-D tokens only)."""
    return batch if batch.tokens.dim() != 2 else batch.select(torch.arange(len(batch), device=batch.tokens.device))


def passes(lengths: Tensor, per_position: int, budget: int | None = None, slack: float = 0.1) -> list[Tensor]:
    """Row indices in passes: by decreasing length, each pass holding about ``budget`` activation
    elements (rows × its longest row × ``per_position``) and padding its rows to its longest by at
    most ``slack`` of their real positions (:func:`~attnaudit.data.batching.length_groups`), so
    no pass spends its time on padding; except passes of at most :data:`_PASS_OVERHEAD` ``/ per_position²``
    positions, which grow whatever their padding (their fixed cost outweighs it)."""
    budget = _PASS_ELEMENTS if budget is None else budget
    floor = _PASS_OVERHEAD // max(per_position, 1) ** 2
    out: list[Tensor] = []
    for group in length_groups(lengths, slack, floor):
        size = max(1, budget // (max(int(lengths[group[0]]), 1) * max(per_position, 1)))
        out.extend(group[start : start + size] for start in range(0, len(group), size))
    return out


def perturbed_probs(
    model: AttentionModel, batch: Batch, rows: Tensor, keep: Tensor, target: Tensor, mode: Mode
) -> Tensor:
    """``p(target[r] | instance rows[r] keeping only keep[r])`` for every row, ``(R,)``.

    Identical (instance, keep) rows run once; the distinct ones go through ``model`` in passes
    of similar length (:func:`passes`): the kept length when deleting, the instance's length
    when masking.
    """
    if rows.numel() == 0:
        return torch.zeros(0, dtype=torch.float64)
    device = batch.tokens.device
    key = torch.cat([rows.cpu()[:, None], keep.cpu().long()], 1)
    unique, inverse = torch.unique(key, dim=0, return_inverse=True)
    u_rows, u_keep = unique[:, 0], unique[:, 1:].bool()
    fill_id = filler(model)[0]
    per_item = batch.tokens[0, 0].numel()  # HAN: the words of a sentence
    length = u_keep.sum(1) if mode == "delete" else batch.mask.reshape(len(batch), -1).sum(1).cpu()[u_rows] // per_item
    width = max(model.config.d_model, model.config.hidden_dim, model.config.embed_dim)
    out = torch.empty(len(unique), dtype=torch.float64)
    with evaluation(model), torch.no_grad():
        for part in passes(length, per_item * width):
            sub = perturbed(model, batch, u_rows[part].to(device), u_keep[part].to(device), mode, fill_id)
            probs = model.logits_forward(sub).probs.double().cpu()
            out[part] = probs.gather(1, target.cpu()[u_rows[part]][:, None]).squeeze(1)
    return out[inverse]


def predictions(model: AttentionModel, batch: Batch) -> tuple[Tensor, Tensor]:
    """The predicted class ``ŷ`` ``(B,)`` and its probability ``p(ŷ|x)`` ``(B,)`` (float64) on the unperturbed batch."""
    with evaluation(model), torch.no_grad():
        return decisions(model.logits_forward(batch).probs)


def decisions(probs: Tensor) -> tuple[Tensor, Tensor]:
    """The predicted class ``ŷ`` ``(B,)`` and ``p(ŷ|x)`` ``(B,)`` (float64, CPU) of class probabilities ``(B,C)``."""
    probs = probs.double().cpu()
    pred = probs.argmax(-1)
    return pred, probs.gather(1, pred[:, None]).squeeze(1)


def perturbation_probs(
    model: AttentionModel, batch: Batch, scores: dict[str, Tensor], percents: Sequence[float], mode: Mode,
    pred: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``p(ŷ)`` with each method's top-k items removed and with only them kept, ``(M, F, B)`` each.

    ``scores``: method -> ``(B,K)``; ``percents``: the ``F`` fractions (percent of the removable
    items). All ``2·M·F·B`` perturbed inputs are built here and run together
    (:func:`perturbed_probs`); instances with fewer than two removable items get NaN. ``pred``: the
    predicted classes when the caller has them (:func:`predictions`), else computed.
    """
    items = item_mask(model, batch).cpu()
    removable = removable_items(model, batch).cpu()
    groups = item_groups(model, batch)
    everything = removed_with(groups, removable)
    n = removable.sum(1)
    if pred is None:
        pred, _ = predictions(model, batch)
    size = len(n)
    rows, keeps = [], []
    for values in scores.values():
        ranks = rank_items(values.cpu(), removable)
        for percent in percents:
            top = removed_with(groups, top_items(ranks, removable, top_count(n, percent)))
            keeps += [items & ~top, items & ~(everything & ~top)]  # without the top items; only them (+ specials)
            rows += [torch.arange(size)] * 2
    probs = perturbed_probs(model, batch, torch.cat(rows), torch.cat(keeps), pred, mode)
    probs = probs.view(len(scores), len(percents), 2, size)
    probs = probs.masked_fill((n < 2)[None, None, None, :], float("nan"))
    return probs[:, :, 0], probs[:, :, 1]


# --------------------------------------------------------------------------- the metrics


def comprehensiveness(full: np.ndarray | float, without: np.ndarray | float) -> np.ndarray:
    """``p(ŷ|x) − p(ŷ|x without the top items)`` (elementwise)."""
    return np.asarray(full, dtype=float) - np.asarray(without, dtype=float)


def sufficiency(full: np.ndarray | float, only: np.ndarray | float) -> np.ndarray:
    """``p(ŷ|x) − p(ŷ|only the top items)`` (elementwise)."""
    return np.asarray(full, dtype=float) - np.asarray(only, dtype=float)


def aopc(per_bin: np.ndarray) -> np.ndarray:
    """Area over the perturbation curve: the mean over the bins (last axis)."""
    return np.asarray(per_bin, dtype=float).mean(-1)


def token_f1(selected: np.ndarray, positive: np.ndarray) -> float:
    """F1 of a selected set of units against the rationale units (both boolean); 0 when either is empty."""
    hits = float(np.sum(selected & positive))
    chosen, gold = float(np.sum(selected)), float(np.sum(positive))
    if hits == 0 or chosen == 0 or gold == 0:
        return 0.0
    precision, recall = hits / chosen, hits / gold
    return 2 * precision * recall / (precision + recall)


def top_units(scores: np.ndarray, k: int) -> np.ndarray:
    """Boolean mask of the ``k`` highest scores (ties by position)."""
    chosen = np.zeros(scores.size, dtype=bool)
    chosen[np.argsort(-scores, kind="stable")[: max(0, min(k, scores.size))]] = True
    return chosen


def topk_overlap(a: np.ndarray, b: np.ndarray, k: int) -> float:
    """``|top-k(a) ∩ top-k(b)| / k`` (ties by position); NaN when ``k < 1``."""
    if k < 1:
        return math.nan
    return float(np.sum(top_units(a, k) & top_units(b, k))) / min(k, a.size)


def agreement(scores: dict[str, np.ndarray], k: int) -> dict[tuple[str, str], tuple[float, float]]:
    """Kendall τ-b and top-``k`` overlap of every ordered pair of methods on one instance."""
    names = list(scores)
    out: dict[tuple[str, str], tuple[float, float]] = {}
    for i, a in enumerate(names):
        for b in names[i:]:
            tau = 1.0 if a == b else kendall_tau(scores[a], scores[b])[0]
            pair = (tau, topk_overlap(scores[a], scores[b], k))
            out[(a, b)] = out[(b, a)] = pair
    return out


def bootstrap_ci(values: Sequence[float] | np.ndarray, seed: int, resamples: int = 1000, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of the finite ``values`` (:func:`scipy.stats.bootstrap`,
    seeded); ``(nan, nan)`` with fewer than two values, the value itself when all are equal."""
    arr = np.asarray(values, dtype=float)
    arr = arr[np.isfinite(arr)]
    if arr.size < 2:
        return math.nan, math.nan
    if np.all(arr == arr[0]):
        return float(arr[0]), float(arr[0])
    res = stats.bootstrap(
        (arr,), np.mean, n_resamples=resamples, confidence_level=level, method="percentile",
        random_state=np.random.default_rng(seed), vectorized=True,
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def describe(values: Sequence[float] | np.ndarray, seed: int, resamples: int) -> dict[str, Any]:
    """``mean``, ``ci_low``, ``ci_high`` (95 % percentile bootstrap) and ``n`` of the finite values."""
    arr = np.asarray(values, dtype=float)
    finite = arr[np.isfinite(arr)]
    low, high = bootstrap_ci(finite, seed, resamples)
    return {"mean": float(finite.mean()) if finite.size else math.nan, "ci_low": low, "ci_high": high, "n": int(finite.size)}
