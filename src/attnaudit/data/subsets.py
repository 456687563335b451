"""Subsets that do not lie: what ``--limit N`` audits, and a record of it.

A split kept in its files' order can be sorted by label, date or source (the SST test split of Jain &
Wallace lists 93% positive sentences first), so its first N examples may describe one class only.
``--limit N`` therefore draws a seeded sample **stratified by label**: each label keeps its share of
the split (largest remainders, ties to the label listed first), the examples of a label are drawn
with the seed, and the sample keeps the split's order. Examples without one label per instance
(tagging, translation) are drawn uniformly. ``order="first"`` keeps the first N, as files list them.
:func:`describe` says what was audited: the subset's label counts next to the split's.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Any

from attnaudit.data.types import Example
from attnaudit.errors import AttnAuditError

ORDERS = ("stratified", "first")
"""How ``--limit`` chooses: a seeded sample stratified by label (the default), or the first N."""


def check_order(order: str) -> str:
    """``order`` if it is one of :data:`ORDERS`; a one-line error otherwise."""
    if order not in ORDERS:
        raise AttnAuditError(f"--limit-order must be one of {', '.join(ORDERS)}, got {order!r}")
    return order


def _label(example: Example) -> Hashable | None:
    """The instance's label when it has one (not a tag sequence or a target sentence)."""
    label = example.label
    return label if isinstance(label, (str, int)) else None


def limited(examples: Sequence[Example], limit: int | None, seed: int = 0, order: str = "stratified") -> list[Example]:
    """``limit`` examples of ``examples`` chosen by ``order`` (all when ``limit`` is None or not smaller), in their order."""
    check_order(order)
    if limit is not None and limit < 1:
        raise AttnAuditError(f"--limit must be at least 1, got {limit}")
    if limit is None or limit >= len(examples):
        return list(examples)
    if order == "first":
        return list(examples[:limit])
    rng = random.Random(seed)
    labels = [_label(example) for example in examples]
    if any(label is None for label in labels):
        return [examples[i] for i in sorted(rng.sample(range(len(examples)), limit))]
    groups: dict[Hashable, list[int]] = {}
    for index, label in enumerate(labels):
        groups.setdefault(label, []).append(index)
    chosen: list[int] = []
    for label, quota in _quotas({label: len(members) for label, members in groups.items()}, limit).items():
        chosen += rng.sample(groups[label], quota)
    return [examples[i] for i in sorted(chosen)]


def _quotas(sizes: dict[Hashable, int], limit: int) -> dict[Hashable, int]:
    """Each label's share of ``limit``, proportional to its size: floors, then the largest remainders."""
    total = sum(sizes.values())
    exact = {label: limit * size / total for label, size in sizes.items()}
    quotas = {label: int(share) for label, share in exact.items()}
    by_remainder = sorted(sizes, key=lambda label: -(exact[label] - quotas[label]))  # stable: the label listed first wins ties
    for label in by_remainder[: limit - sum(quotas.values())]:
        quotas[label] += 1
    return quotas


def label_counts(examples: Sequence[Example]) -> dict[str, int]:
    """How many examples carry each label (instances without one label are not counted)."""
    return dict(sorted(Counter(str(label) for label in map(_label, examples) if label is not None).items()))


def describe(split: str, full: Sequence[Example], chosen: Sequence[Example], limit: int | None, order: str, seed: int) -> dict[str, Any]:
    """What was audited: ``n`` of the split's ``of`` examples, how they were chosen, and both label counts."""
    return {
        "split": split,
        "n": len(chosen),
        "of": len(full),
        "limit": limit,
        "chosen": "all" if limit is None or limit >= len(full) else ("first" if order == "first" else f"stratified by label, seed {seed}"),
        "labels": label_counts(chosen),
        "split_labels": label_counts(full),
    }
