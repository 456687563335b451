"""Erasure tests of Serrano & Smith (2019), "Is Attention Interpretable?".

Both tests intervene at the explained attention layer only: the encoder outputs are
cached once (``model.cache_at``) and only attention and what follows it is rerun
(``model.decode``), exactly as S&S erase at the attention layer.  Erasing an item sets its
weight to 0 in every head and query and renormalises each row over the remaining items.

* **Single weight** (S&S §4): erase the item with the highest attention, then (separately)
  one seeded random other item; compare the JS divergences of the output distributions
  from the original, the erased weights, and whether the decision flipped.
* **Erase until the decision flips** (S&S §5): remove items one at a time in the order of
  a ranking (attention, random, gradient w.r.t. attention, gradient×attention, leave-one-out,
  integrated gradients) until the predicted label changes, and record the fraction removed.
  Batched: every unfinished instance of a batch removes its next item in the same decode
  call, so a batch costs one decode per removal step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnaudit.algorithms.metrics import jsd
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.common.passes import prepare as prepare_layers
from attnaudit.experiments.experiment import AuditSettings, Experiment, Result, counted, joined, register, summarise, where
from attnaudit.explain import EXPLANATIONS, Explanation, choose, item_mask
from attnaudit.explain.helpers.features import group_members
from attnaudit.explain.registry import first_items, item_groups, per_segment
from attnaudit.models.interface import (
    AttentionModel,
    Cache,
    Intervention,
    WeightsFn,
    evaluation,
)
from attnaudit.plotting import save_figure
from attnaudit.progress import track
from attnaudit.run import Run

RANDOM = "random"
DEFAULT_RANKINGS = ["attention", RANDOM, "attention_gradient", "gradient_x_attention", "loo", "ig"]
PUBLISHED: dict[str, str] = {
    "paper": "Serrano & Smith (2019), Is Attention Interpretable?, ACL",
    "single_weight": (
        "Erasing the top-attention item usually changes the output more than erasing a random item "
        "(delta JS mostly >= 0), but the differences are mostly small, and for the HAN models erasing "
        "the top item leaves the decision unchanged in the vast majority of test instances "
        "(§4, Fig. 3-4, Table 2)."
    ),
    "until_flip": (
        "Removing items by attention ranking needs a large fraction of items before the decision "
        "flips; rankings by gradient and by gradient x attention flip it after fewer removals "
        "(§5, Fig. 5)."
    ),
}
# Tags of the seeded streams: the single-weight random item, then random order r uses 1 + r.
_SINGLE_STREAM = 0


def erase_items(removed: Tensor) -> WeightsFn:
    """Weights function zeroing the keys marked in ``removed`` ``(B,K)`` and renormalising.

    Every head and query loses the key; each row is divided by its remaining mass.  A row
    whose remaining mass is exactly 0 (only possible with sparse normalisers, when every
    item in the support was erased) stays all-zero: there is nothing left to renormalise.
    Items are the first keys: pair Transformers attend over text then query, and only the
    text keys are items, so ``removed`` may be narrower than the key axis.
    """

    def fn(weights: Tensor, _key_mask: Tensor) -> Tensor:
        extra = weights.shape[-1] - removed.shape[-1]
        erased = torch.nn.functional.pad(removed, (0, extra), value=False) if extra else removed
        kept = weights * (~erased).to(weights.dtype)[:, None, None, :]
        total = kept.sum(-1, keepdim=True)
        return torch.where(total > 0, kept / total.clamp_min(torch.finfo(kept.dtype).tiny), kept)

    return fn


@dataclass
class Explained:
    """A batch prepared for erasure: a cache restarting at the explained layer and the decisions.

    ``mask`` ``(B,K)`` marks the real items (:func:`attnaudit.explain.item_mask`: tokens,
    HAN sentences, the text keys of a pair Transformer), the axis rankings are over;
    ``attention`` ``(B,K)`` the ``attention`` explanation read from the same pass; ``weights`` ``(B,H,Q,K)``
    the explained layer's weights as a decode from ``cache`` computes them (None: recomputed at every erasure).
    """

    cache: Cache
    layer: int
    probs: Tensor
    pred: Tensor
    mask: Tensor
    lengths: Tensor
    attention: Tensor
    weights: Tensor | None = None
    groups: Tensor | None = None
    """With segments: each item's segment (:func:`~attnaudit.explain.registry.item_groups`); ``mask`` then marks each
    segment's first item, which stands for it, and every erasure takes the whole segment (:meth:`erased`)."""

    def erased(self, removed: Tensor, rows: Tensor | None = None) -> Tensor:
        """``removed`` ``(R,K)`` (of instances ``rows``, default all) spread over whole segments."""
        if self.groups is None:
            return removed
        return group_members(removed, self.groups if rows is None else self.groups.index_select(0, rows))


def prepare(run: Run, batch: Any) -> Explained:
    """Encode once, run the model, and cache the states entering the explained layer (a decoder: at
    its predicting token only, :func:`attnaudit.experiments.common.passes.prepare`)."""
    model = run.model
    layer = model.explained_layer % model.num_attention_layers
    prepared = prepare_layers(model, batch, [layer])
    assert prepared.attention is not None  # the explained layer alone
    mask = item_mask(model, batch)
    groups = item_groups(model, batch)
    if groups is not None:  # one item per segment: its first
        groups = groups.to(mask.device)
        mask = mask & first_items(groups)
    probs = prepared.probs
    return Explained(prepared.cache, layer, probs, probs.argmax(-1), mask, mask.sum(-1), per_segment(model, batch, prepared.attention),
                     prepared.weights[0], groups)


def decode_erased(
    model: AttentionModel, cache: Cache, layer: int, removed: Tensor, weights: Tensor | None = None
) -> Tensor:
    """Output distributions ``(B,C)`` with the items in ``removed`` erased at ``layer``.

    ``weights`` ``(B,H,Q,K)``: the layer's weights for the rows of ``cache``, when known; they are erased here
    and given as a tensor, so the layer's scores are not computed again for every erasure.
    """
    erase = erase_items(removed)
    given = erase if weights is None else erase(weights, cache.mask)
    with torch.no_grad():
        out = model.decode(cache, [Intervention(layer=layer, weights=given)], start_layer=layer)
    return out.logits.softmax(-1)


@dataclass
class FlipSteps:
    """Per instance: items removed when the decision flipped (0 if it never did), and whether it did."""

    removed: Tensor
    flipped: Tensor
    decode_calls: int


def flip_steps(
    model: AttentionModel, explained: Explained, order: Tensor, instance: Tensor | None = None
) -> FlipSteps:
    """Remove items in ``order`` ``(R,K)`` one per step until each row's decision flips.

    Row ``r`` erases in instance ``instance[r]`` (default: row ``r``), so several orders of a
    batch (a ranking and random ones) run stacked, one decode call per step for all of them.
    An instance with ``n`` items can lose at most ``n - 1`` (the last item cannot be erased:
    renormalising zero mass is undefined); if its decision is still unchanged then, it never
    flipped.  Instances with one item are never run.  Only unfinished rows are decoded.
    """
    size, width = order.shape
    device = order.device
    instance = torch.arange(size, device=device) if instance is None else instance
    lengths, pred = explained.lengths[instance], explained.pred[instance]
    removed = torch.zeros((size, width), dtype=torch.bool, device=device)
    steps = torch.zeros(size, dtype=torch.long, device=device)
    flipped = torch.zeros(size, dtype=torch.bool, device=device)
    active = lengths > 1
    calls = 0
    for step in range(1, width):
        active &= lengths > step
        rows = active.nonzero().squeeze(1)
        if rows.numel() == 0:
            break
        removed[rows, order[rows, step - 1]] = True
        picked = instance[rows]
        weights = None if explained.weights is None else explained.weights.index_select(0, picked)
        probs = decode_erased(model, explained.cache.select(picked), explained.layer, explained.erased(removed[rows], picked), weights)
        calls += 1
        hit = rows[probs.argmax(-1) != pred[rows]]
        flipped[hit] = True
        steps[hit] = step
        active[hit] = False
    return FlipSteps(steps, flipped, calls)


def stacked_flip_steps(model: AttentionModel, explained: Explained, orders: list[Tensor]) -> list[FlipSteps]:
    """:func:`flip_steps` of several ``(B,K)`` orders of one batch in one stacked search, split back
    per order (each with the decode calls of the whole search)."""
    size = len(explained.lengths)
    instance = torch.arange(size, device=orders[0].device).repeat(len(orders))
    stacked = flip_steps(model, explained, torch.cat(orders), instance)
    parts = [slice(i * size, (i + 1) * size) for i in range(len(orders))]
    return [FlipSteps(stacked.removed[part], stacked.flipped[part], stacked.decode_calls) for part in parts]


def order_by(scores: Tensor, mask: Tensor) -> Tensor:
    """Item indices ``(B,K)`` by decreasing score (ties: earlier position first), padding last."""
    filled = scores.detach().to(torch.float64).masked_fill(~mask, float("-inf"))
    return torch.sort(filled, dim=-1, descending=True, stable=True).indices


def random_order(seed: int, index: int, repeat: int, length: int, width: int) -> list[int]:
    """A seeded permutation of the ``length`` real items of instance ``index``, padded to ``width``.

    The stream depends only on (seed, instance index, repeat), not on batching, so batched and
    one-at-a-time runs use the same orders.
    """
    perm = np.random.default_rng([seed, index, 1 + repeat]).permutation(length).tolist()
    return perm + list(range(length, width))


def random_other(seed: int, index: int, top: int, length: int) -> int:
    """A seeded uniform choice among the items of instance ``index`` other than ``top``."""
    pick = int(np.random.default_rng([seed, index, _SINGLE_STREAM]).integers(length - 1))
    return pick if pick < top else pick + 1


def ranking_orders(
    ranking: str, scores: dict[str, Tensor], explained: Explained, indices: list[int], seed: int, repeats: int
) -> list[Tensor]:
    """The removal orders ``(B,K)`` of ``ranking`` for a batch: one, or ``repeats`` seeded ones for random.

    ``scores`` maps ranking names to importance ``(B,K)``; ``indices`` are the instances'
    positions in the evaluated list (they seed the random orders).
    """
    if ranking != RANDOM:
        return [order_by(scores[ranking], explained.mask)]
    width = explained.mask.shape[1]
    lengths = explained.lengths.tolist()
    places = item_places(explained.mask)
    return [
        torch.tensor(
            [[place[j] for j in random_order(seed, i, r, n, width)] for i, n, place in zip(indices, lengths, places)],
            device=explained.mask.device,
        )
        for r in range(repeats)
    ]


def item_places(mask: Tensor) -> list[list[int]]:
    """Per instance, the key positions of its items, then the others: item ``j`` of a random order is at
    ``place[j]`` (the identity when the items are a row's first positions; a zero-shot prompt's text span otherwise)."""
    order = torch.sort((~mask).to(torch.int8), dim=1, stable=True).indices
    return order.tolist()


def importance_functions(names: list[str], model: AttentionModel | None = None) -> dict[str, Explanation]:
    """The explanations behind ``names`` (plus ``attention``, which the single test uses), each
    applying to ``model`` when given; ``random`` is this test's own seeded orders, not an explanation's scores."""
    choices = Erasure.explanation_choices()
    unknown = [n for n in names if n not in choices]
    if unknown:
        raise AttnAuditError(f"unknown ranking(s) {', '.join(unknown)}; choose from {', '.join(choices)}")
    return choose(sorted({"attention", *(n for n in names if n != RANDOM)}), option="--rankings", model=model)


def _single(
    model: AttentionModel, explained: Explained, attention: Tensor, indices: list[int], seed: int
) -> dict[str, Tensor]:
    """S&S §4 for one batch: erase the top-attention item, then a random other one."""
    top = attention.detach().masked_fill(~explained.mask, float("-inf")).argmax(-1)
    lengths = explained.lengths.tolist()
    places = item_places(explained.mask)
    rank = [place.index(int(t)) for place, t in zip(places, top.tolist())]  # the top item's number among the items
    rand = torch.tensor(
        [place[random_other(seed, i, k, n)] if n > 1 else place[k] for i, k, n, place in zip(indices, rank, lengths, places)],
        device=top.device,
    )
    out: dict[str, Tensor] = {"top": top, "rand": rand}
    rows = torch.arange(len(indices), device=top.device)
    for name, item in (("max", top), ("rand", rand)):
        removed = torch.zeros_like(explained.mask)
        removed[rows, item] = True
        probs = decode_erased(model, explained.cache, explained.layer, explained.erased(removed), explained.weights)
        out[f"jsd_{name}"] = jsd(explained.probs, probs)
        out[f"flip_{name}"] = probs.argmax(-1) != explained.pred
        out[f"weight_{name}"] = attention.detach()[rows, item]
    return out


def _flip_summary(rows: list[dict[str, Any]], n_length1: int) -> dict[str, Any]:
    """Median/mean fraction over the runs that flipped; never-flipped runs counted apart."""
    fractions = [r["fraction"] for r in rows if r["flipped"]]
    never = sum(not r["flipped"] for r in rows)
    stats = summarise(fractions)
    return {
        "runs": len(rows),
        "flipped": len(fractions),
        "never_flipped": never,
        "share_never": never / len(rows) if rows else float("nan"),
        "median_fraction": stats["median"],
        "mean_fraction": stats["mean"],
        "std_fraction": stats["std"],
        "excluded_length1": n_length1,
    }


@register
class Erasure(Experiment):
    """Serrano & Smith's single-weight and erase-until-flip tests at the explained attention layer."""

    name = "erasure"
    settings = AuditSettings(
        rank=9,
        decoder_options={"rankings": ["attention", "random"], "random_orders": 2, "batch_size": 8},
        demo={"full": {"random_orders": 3}, "quick": {"random_orders": 1, "rankings": ["random", "attention", "gradient"]}},
        instance_effects={
        "removed_attention": ("items erased in attention order until the decision flipped (empty: never)", "asc"),
        "fraction_attention": ("share of items erased in attention order until the flip (1: never)", "asc"),
        "jsd_max": ("output change (JSD) after erasing the top-attended item", "desc"),
    },
    )
    # an LLM: no ranking that needs extra passes per token (loo, ig, attention gradients)
    description = (
        "Erase attention at the explained layer: top vs random single item (JSD, flips), and items "
        "removed in ranking order until the decision flips"
    )
    paper = "Serrano & Smith 2019"

    @dataclass
    class Options:
        rankings: list[str] = field(
            default_factory=lambda: list(DEFAULT_RANKINGS),
            metadata={"help": "Orders to erase in: random (seeded orders) and explanations (`attnaudit explanations`)."},
        )
        random_orders: int = field(default=5, metadata={"help": "Seeded random orders per instance."})
        batch_size: int = field(default=32, metadata={"help": "Instances per batch."})

    @classmethod
    def explanation_choices(cls) -> list[str]:
        """``random`` (this test's seeded orders) and every registered explanation."""
        return [RANDOM, *(n for n in EXPLANATIONS if n != RANDOM)]

    def applies(self, run: Run) -> str | None:
        if run.task.task_type not in ("classification", "pair"):
            return (
                "the erasure tests need one decision per instance (classification, pair/QA); "
                f"task type {run.task.task_type!r} has none"
            )
        return None

    shardable = True

    def part(self, run: Run, examples: list[Any], options: Any, seed: int = 0, indices: Sequence[int] | None = None) -> Result:
        if options.random_orders < 1:
            raise AttnAuditError(f"--random-orders must be at least 1, got {options.random_orders}")
        if options.batch_size < 1:
            raise AttnAuditError(f"--batch-size must be at least 1, got {options.batch_size}")
        rankings = list(dict.fromkeys(options.rankings))
        if not rankings:
            raise AttnAuditError("--rankings is empty; give at least one ranking")
        functions = importance_functions(rankings, run.model)
        model = run.model
        instances: list[dict[str, Any]] = []
        long_rows: list[dict[str, Any]] = []
        calls = 0
        tested = where(examples, indices)
        with evaluation(model):
            batches = run.sorted_batches(examples, options.batch_size)
            total = -(-len(examples) // options.batch_size)
            for positions, batch in track(batches, "erasure", total=total):
                at = [tested[i] for i in positions]
                explained = prepare(run, batch)
                scores = {name: fn(run.model, batch, seed=seed) for name, fn in functions.items() if name != "attention"}
                scores["attention"] = explained.attention  # the prepared pass's own attention: no second pass
                single = _single(model, explained, scores["attention"], at, seed)
                rows = self._instance_rows(run, batch, explained, single, at)
                runs = [
                    (ranking, repeat, len(orders), order)
                    for ranking in rankings
                    for orders in [ranking_orders(ranking, scores, explained, at, seed, options.random_orders)]
                    for repeat, order in enumerate(orders)
                ]
                results = stacked_flip_steps(model, explained, [order for *_, order in runs])  # one search for all
                calls += results[0].decode_calls
                for (ranking, repeat, repeats, _), result in zip(runs, results):
                    self._record(ranking, repeat, repeats, result, rows, long_rows)
                instances.extend(rows)
        instances.sort(key=lambda row: row["index"])
        long_rows.sort(key=lambda row: row["index"])  # stable: rankings and repeats keep their order
        return Result(test=self.name, instances=instances, tables={"until_flip": long_rows}, meta={"decode_calls": calls})

    def merge(self, run: Run, parts: list[Result], options: Any, seed: int = 0) -> Result:
        rankings = list(dict.fromkeys(options.rankings))
        return self._result(run, joined(parts), joined(parts, "until_flip"), rankings, options, counted(parts, "decode_calls"))

    @staticmethod
    def _instance_rows(
        run: Run, batch: Any, explained: Explained, single: dict[str, Tensor], indices: list[int]
    ) -> list[dict[str, Any]]:
        """Per-instance rows with the single-weight results (NaN/None for one-item instances)."""
        nan = float("nan")
        values = {k: v.tolist() for k, v in single.items()}
        rows = []
        for b, index in enumerate(indices):
            n = int(explained.lengths[b])
            example = batch.examples[b]
            row: dict[str, Any] = {
                "index": index,
                "source": example.meta.get("source", ""),
                "length": n,
                "label": example.label,
                "pred": run.labels[int(explained.pred[b])],
            }
            ok = n > 1
            row.update(
                {
                    "erased_max": values["top"][b] if ok else None,
                    "erased_rand": values["rand"][b] if ok else None,
                    "weight_max": values["weight_max"][b] if ok else nan,
                    "weight_rand": values["weight_rand"][b] if ok else nan,
                    "delta_weight": values["weight_max"][b] - values["weight_rand"][b] if ok else nan,
                    "jsd_max": values["jsd_max"][b] if ok else nan,
                    "jsd_rand": values["jsd_rand"][b] if ok else nan,
                    "delta_jsd": values["jsd_max"][b] - values["jsd_rand"][b] if ok else nan,
                    "flip_max": bool(values["flip_max"][b]) if ok else None,
                    "flip_rand": bool(values["flip_rand"][b]) if ok else None,
                }
            )
            rows.append(row)
        return rows

    @staticmethod
    def _record(
        ranking: str,
        repeat: int,
        repeats: int,
        result: FlipSteps,
        rows: list[dict[str, Any]],
        long_rows: list[dict[str, Any]],
    ) -> None:
        """Add one run of a ranking to the instance rows and the long table.

        The fraction is ``removed / n`` at the flip, 1.0 when the decision never flipped
        (one-item instances: None); ``removed_<ranking>`` the items erased until the flip
        (None when it never flipped).
        """
        column = ranking if ranking != RANDOM or repeats == 1 else f"{ranking}{repeat}"
        removed, flipped = result.removed.tolist(), result.flipped.tolist()
        for b, row in enumerate(rows):
            n = row["length"]
            if n < 2:
                row[f"fraction_{column}"] = None
                row[f"flipped_{column}"] = None
                row[f"removed_{column}"] = None
                continue
            fraction = removed[b] / n if flipped[b] else 1.0
            row[f"fraction_{column}"] = fraction
            row[f"removed_{column}"] = removed[b] if flipped[b] else None
            row[f"flipped_{column}"] = bool(flipped[b])
            long_rows.append(
                {
                    "index": row["index"],
                    "ranking": ranking,
                    "order": repeat,
                    "length": n,
                    "removed": removed[b] if flipped[b] else None,
                    "fraction": fraction,
                    "flipped": bool(flipped[b]),
                }
            )

    @staticmethod
    def _result(
        run: Run,
        instances: list[dict[str, Any]],
        long_rows: list[dict[str, Any]],
        rankings: list[str],
        options: Any,
        calls: int,
    ) -> Result:
        n_length1 = sum(r["length"] < 2 for r in instances)
        single = [r for r in instances if r["length"] > 1]
        summary: dict[str, Any] = {
            "n": len(instances),
            "excluded_length1": n_length1,
            "single_n": len(single),
        }
        if single:
            delta = [r["delta_jsd"] for r in single]
            summary.update(
                {
                    "single_top_beats_random": float(np.mean([r["jsd_max"] > r["jsd_rand"] for r in single])),
                    "single_delta_jsd_negative": float(np.mean([d < 0 for d in delta])),
                    "single_delta_jsd_median": summarise(delta)["median"],
                    "single_jsd_max_mean": summarise([r["jsd_max"] for r in single])["mean"],
                    "single_jsd_rand_mean": summarise([r["jsd_rand"] for r in single])["mean"],
                    "single_flip_rate_max": float(np.mean([r["flip_max"] for r in single])),
                    "single_flip_rate_rand": float(np.mean([r["flip_rand"] for r in single])),
                }
            )
        flip_table = [
            {
                "top_flips": top,
                "random_flips": sum(r["flip_max"] == top and r["flip_rand"] for r in single),
                "random_keeps": sum(r["flip_max"] == top and not r["flip_rand"] for r in single),
            }
            for top in (True, False)
        ]
        per_ranking = []
        for ranking in rankings:
            stats = {"ranking": ranking, **_flip_summary([r for r in long_rows if r["ranking"] == ranking], n_length1)}
            per_ranking.append(stats)
            for key in ("median_fraction", "share_never"):  # the rest is in the until_flip_summary table
                summary[f"flip_{ranking}_{key}"] = stats[key]
        summary["decode_calls"] = calls
        notes = _notes(run, rankings, options, n_length1)
        return Result(
            test="erasure",
            summary=summary,
            instances=instances,
            tables={"until_flip": long_rows, "until_flip_summary": per_ranking, "single_flips": flip_table},
            meta={
                "notes": notes,
                "rankings": rankings,
                "published": dict(PUBLISHED),
            },
        )

    def verdict(self, result: Result) -> list[dict[str, Any]]:
        """Does erasing by attention find the items that decide? (Serrano & Smith 2019, §4-5)."""
        s = result.summary

        def number(key: str) -> float | None:
            value = s.get(key)
            return float(value) if isinstance(value, (int, float)) and np.isfinite(value) else None

        rows = []
        beats = number("single_top_beats_random")
        if beats is not None:
            delta = number("single_delta_jsd_median")
            rows.append(
                {
                    "statistic": "single_top_beats_random",
                    "value": beats,
                    "published": "usually, but by small margins (S&S 2019, §4)",
                    "interpretation": f"erasing the highest-attention item changes the output more than erasing a random "
                    f"item in {beats:.0%} of instances"
                    + (f" (median ΔJSD {delta:.3g})" if delta is not None else "")
                    + ("; attention points at items that matter more than chance" if beats > 0.5 else "; no better than chance"),
                }
            )
        attention = number("flip_attention_median_fraction")
        if attention is not None:
            others = {
                name: number(f"flip_{name}_median_fraction")
                for name in ("random", "gradient", "gradient_x_attention", "loo", "ig", "attention_gradient")
            }
            compared = ", ".join(f"{name} {value:.0%}" for name, value in others.items() if value is not None)
            better = [name for name, value in others.items() if value is not None and name != "random" and value < attention]
            rows.append(
                {
                    "statistic": "flip_attention_median_fraction",
                    "value": attention,
                    "published": "larger than for gradient-based rankings (S&S 2019, Fig. 5)",
                    "interpretation": f"erasing by attention flips the decision after a median {attention:.0%} of the "
                    f"items ({compared or 'no other ranking'}); "
                    + (
                        f"{', '.join(better)} find the deciding items faster, so attention is not the best account of the decision"
                        if better
                        else "no other ranking finds the deciding items faster"
                    ),
                }
            )
        return rows or super().verdict(result)

    def plot(self, result: Result, directory: Path) -> list[Path]:
        from attnaudit.plotting import pyplot

        plt = pyplot()

        paths: list[Path] = []
        single = [r for r in result.instances if r.get("delta_jsd") is not None and np.isfinite(r["delta_jsd"])]
        if single:
            fig, ax = plt.subplots(figsize=(5, 4))
            flipped = np.array([bool(r["flip_max"]) for r in single])
            x = np.array([r["delta_weight"] for r in single])
            y = np.array([r["delta_jsd"] for r in single])
            ax.scatter(x[~flipped], y[~flipped], s=10, alpha=0.6, label="top erasure keeps decision")
            ax.scatter(x[flipped], y[flipped], s=14, alpha=0.8, color="tab:red", label="top erasure flips decision")
            ax.axhline(0.0, color="black", linewidth=0.8)
            ax.set_xlabel("attention of top item - attention of random item")
            ax.set_ylabel("JSD(top erased) - JSD(random erased)")
            ax.set_title("single-weight erasure (S&S Fig. 3)")
            ax.legend(fontsize=8)
            paths += save_figure(fig, directory, "erasure_single")

            s = result.summary
            fig, ax = plt.subplots(figsize=(4, 3.5))
            rates = [s.get("single_flip_rate_max", 0.0), s.get("single_flip_rate_rand", 0.0)]
            ax.bar(["top item", "random item"], rates, color=["tab:red", "tab:gray"])
            for i, rate in enumerate(rates):
                ax.text(i, rate, f"{rate:.1%}", ha="center", va="bottom", fontsize=9)
            ax.set_ylabel("share of instances whose decision flips")
            ax.set_ylim(0, max(max(rates) * 1.2, 0.05))
            ax.set_title(f"single-weight erasure, n={s.get('single_n', len(single))}")
            paths += save_figure(fig, directory, "erasure_flip_rates")

        per_ranking = result.tables.get("until_flip_summary", [])
        rows = result.tables.get("until_flip", [])
        if per_ranking and rows:
            names = [r["ranking"] for r in per_ranking]
            data = [[r["fraction"] for r in rows if r["ranking"] == name and r["flipped"]] for name in names]
            fig, ax = plt.subplots(figsize=(1.3 * len(names) + 2, 4))
            ax.boxplot([d if d else [float("nan")] for d in data], showfliers=True)
            ax.set_xticks(range(1, len(names) + 1))
            ax.set_xticklabels(
                [f"{n}\nnever {r['share_never']:.0%}" for n, r in zip(names, per_ranking)], fontsize=8
            )
            ax.set_ylabel("fraction of items removed at the first flip")
            ax.set_ylim(0, 1.05)
            ax.set_title("erase until the decision flips (S&S Fig. 5)")
            paths += save_figure(fig, directory, "erasure_until_flip")
        return paths


def _notes(run: Run, rankings: list[str], options: Any, n_length1: int) -> list[str]:
    """What the result's numbers mean: the layer, the decision, the items, both tests and what they exclude."""
    notes = [
        f"erasure at attention layer {run.model.explained_layer % run.model.num_attention_layers} (the explained "
        "layer); encoder outputs are cached and unchanged. An erased item gets weight 0 in every head and query "
        "and each attention row is renormalised over the remaining items.",
        "decision = argmax of the model's own output on the unmodified input (not the gold label); a flip is a "
        "change of that argmax.",
        "items: tokens (HAN: sentences; pair Transformers: the text keys, not the query's). single weight "
        "(S&S §4): the top item is the argmax of the 'attention' importance (the weight itself for single-query "
        "attention; for Transformers the weight the key receives averaged over heads and real queries); the random "
        "item is uniform among the other items, seeded by (seed, instance index). JSD in nats.",
        "erase until flip (S&S §5): items are removed in ranking order, highest score first (ties by position); "
        "attention_gradient and gradient_x_attention are signed, so items that most support the decision go "
        "first; random: seeded permutations per (seed, instance index, order). At most n-1 of n items can be removed, "
        "since the last one cannot be erased (zero mass cannot be renormalised); if the decision is unchanged "
        "after n-1 removals the instance never flipped: its fraction is recorded as 1.0 and it is excluded from "
        "the median/mean and counted in share_never.",
        f"excluded from both tests: {n_length1} instance(s) with a single item (nothing can be erased short of "
        "everything, and there is no 'other' random item).",
    ]
    if RANDOM in rankings:
        notes.append(
            f"random ranking: {options.random_orders} seeded order(s) per instance, pooled in the summary "
            "(runs = instances x orders)."
        )
    if run.model.config.attention != "softmax":
        notes.append(
            f"{run.model.config.attention} attention can give items exactly zero weight: erasing them changes "
            "nothing, and erasing the whole support leaves an all-zero attention row (no renormalisation)."
        )
    return notes
