"""Per-instance explanations for the report's token heatmaps, computed from the run itself.

For a handful of instances — the most and least faithful by the column a test declares
(:attr:`~attnaudit.experiments.experiment.AuditSettings.ranks_instances`: the importance test's
τ(attention, gradient)) when that test ran, else the first few — every default explanation the
model supports (:func:`attnaudit.explain.list_explanations`) is computed over the explained
items and stored in ``results/heatmaps.json`` with the item strings, the gold and predicted
labels and the rationale items.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnaudit.data.types import Batch, Example
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.experiment import Result, discover
from attnaudit.explain import Explanation, item_mask, item_names, item_roles, item_values, list_explanations
from attnaudit.explain.registry import item_groups
from attnaudit.run import Run

IG_STEPS = 20
"""Integrated Gradients steps of the report's explanations: the scoreboard's default (the
faithfulness test's ``--ig-steps``)."""
LARGE = 20_000_000
"""Parameters above which the report leaves out the methods that take ``steps`` passes per instance
(Integrated Gradients): on SmolLM2-135M, 20 steps took 98 of the 136 seconds its report spent
explaining 57 instances on 2 CPU cores. ``attnaudit explain --method ig`` computes them."""


def heatmap_methods(run: Run) -> list[Explanation]:
    """The explanations the heatmaps show for ``run``: the default ones that apply to its model,
    less :func:`left_out`."""
    dropped = left_out(run)
    return [m for m in list_explanations(run, default=True) if m.name not in dropped]


def left_out(run: Run) -> list[str]:
    """The default methods the report leaves out for this model (those taking ``steps`` on a model over
    :data:`LARGE` parameters), in listing order."""
    if sum(p.numel() for p in run.model.parameters()) <= LARGE:
        return []
    return [m.name for m in list_explanations(run, default=True) if "steps" in m.options]


def left_out_note(run: Run) -> str:
    """One sentence on :func:`left_out` for the report ("" when nothing is)."""
    dropped = left_out(run)
    if not dropped:
        return ""
    return (f"{', '.join(dropped)} left out: on a model over {LARGE // 1_000_000}M parameters each instance costs "
            f"{IG_STEPS} forward-backward passes; `attnaudit explain --method {dropped[0]}` computes it")


def ranking_result(results_dir: Path) -> tuple[Result | None, str]:
    """The stored result of the first test that ranks instances by faithfulness, and its column."""
    for name, cls in discover().items():
        path = results_dir / f"{name}.json"
        if cls.settings.ranks_instances and path.exists():
            return Result.load(path), cls.settings.ranks_instances
    return None, ""


def select_instances(ranking: Result | None, column: str, n_examples: int, count: int) -> tuple[list[int], dict[int, float], str]:
    """Indices to show, their value of ``column`` (τ(attention, gradient)) if known, and how they were chosen.

    With a ``ranking`` result holding ``column``: the ``count`` highest (most faithful) and
    ``count`` lowest (least faithful) instances with a finite value. Otherwise the first ``2 × count``.
    """
    if ranking is not None and column:
        taus = {}
        for position, row in enumerate(ranking.instances):
            value = row.get(column)
            index = int(row.get("index", position))
            if isinstance(value, (int, float)) and math.isfinite(value) and index < n_examples:
                taus[index] = float(value)
        if taus:
            ranked = sorted(taus, key=lambda i: (-taus[i], i))
            top = ranked[:count]
            bottom = [i for i in reversed(ranked[-count:]) if i not in top]
            how = f"the {len(top)} most and {len(bottom)} least faithful instances by {column} ({ranking.test} test)"
            return top + bottom, taus, how
    chosen = list(range(min(2 * count, n_examples)))
    return chosen, {}, f"the first {len(chosen)} instances (the importance test's τ(attention, gradient) was not available)"


def _rationale_items(run: Run, batch: Batch, row: int) -> list[int]:
    """Items of instance ``row`` that belong to its rationale (HAN: sentences, HF: wordpieces of rationale words)."""
    from attnaudit.experiments.common.units import instance_units

    units = instance_units(run, batch, row)
    if units is None:
        return []
    return [i for i, u in enumerate(units.item_unit.tolist()) if u >= 0 and bool(units.positive[u])]


def compute_heatmaps(run: Run, examples: list[Example], indices: list[int], taus: dict[int, float]) -> list[dict[str, Any]]:
    """Scores of every supported explanation for ``examples[i]``, ``i`` in ``indices`` (one batch)."""
    if run.task.task_type not in ("classification", "pair"):
        raise AttnAuditError(f"heatmaps explain one decision per instance; a {run.task.task_type} model makes one per token")
    if not indices:
        return []
    methods = {m.name: m for m in heatmap_methods(run)}
    batch = next(iter(run.batches([examples[i] for i in indices], batch_size=len(indices))))
    run.model.eval()
    items, groups = item_mask(run, batch), item_groups(run, batch)  # groups: a segmented run's segments (one score each)
    scores = {m: item_values(fn(run.model, batch, steps=IG_STEPS).detach().double(), items, groups) for m, fn in methods.items()}
    with torch.no_grad():
        predicted = run.model(batch).probs.argmax(-1).tolist()
    labels = item_names(run, batch)
    roles = item_roles(batch, items) if batch.roles is not None else None  # a chat-rendered prompt's roles
    out = []
    for row, index in enumerate(indices):
        ex = batch.examples[row]
        predicted_label = run.labels[predicted[row]] if run.labels and predicted[row] < len(run.labels) else str(predicted[row])
        out.append(
            {
                "index": index,
                "label": ex.label,
                "predicted": predicted_label if run.model.trained_head else None,
                "tau": taus.get(index),
                "items": labels[row],
                "rationale": _rationale_items(run, batch, row),
                **({"roles": roles[row]} if roles is not None else {}),
                "scores": {m: np.nan_to_num(values[row], nan=0.0).tolist() for m, values in scores.items()},
            }
        )
    return out


def heatmaps_for(
    run: Run, examples: list[Example], results_dir: Path, count: int
) -> dict[str, Any]:
    """The ``heatmaps.json`` content for ``run``: chosen instances and how they were chosen."""
    ranking, column = ranking_result(results_dir)
    indices, taus, how = select_instances(ranking, column, len(examples), count)
    out: dict[str, Any] = {"selection": how, "instances": compute_heatmaps(run, examples, indices, taus)}
    note = left_out_note(run)
    if note:
        out["note"] = note
    return out
