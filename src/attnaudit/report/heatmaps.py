"""Per-instance explanations for the report's token heatmaps, computed from the run itself.

For a handful of instances — the most and least faithful by τ(attention, gradient) when the
importance test ran, else the first few — every explanation the model supports (attention,
gradient, leave-one-out; rollout and norms for self-attention models) is computed over the
explained items and stored in ``results/heatmaps.json`` with the item strings, the gold
and predicted labels and the rationale items.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnaudit.data.types import Batch, Example
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.base import Result
from attnaudit.run import Run

HEATMAP_METHODS = ("attention", "gradient", "loo", "rollout", "norms")
# Instance columns of the importance test's result that hold τ(attention, gradient), best first.
TAU_COLUMNS = ("tau_attention_vs_gradient", "tau_attention_gradient", "tau_gradient", "kendall_tau_gradient", "tau")


def tau_column(rows: list[dict[str, Any]]) -> str | None:
    """The importance result's per-instance τ(attention, gradient) column, if it has one."""
    if not rows:
        return None
    keys = list(rows[0])
    for name in TAU_COLUMNS:
        if name in keys:
            return name
    candidates = [k for k in keys if "tau" in k and "grad" in k and "top" not in k and not k.endswith(("_p", "pvalue"))]
    return candidates[0] if candidates else None


def select_instances(importance: Result | None, n_examples: int, count: int) -> tuple[list[int], dict[int, float], str]:
    """Indices to show, their τ(attention, gradient) if known, and how they were chosen.

    With an importance result: the ``count`` highest-τ (most faithful) and ``count`` lowest-τ
    (least faithful) instances with a finite τ. Otherwise the first ``2 × count``.
    """
    column = tau_column(importance.instances) if importance else None
    if importance is not None and column:
        taus = {}
        for position, row in enumerate(importance.instances):
            value = row.get(column)
            index = int(row.get("index", position))
            if isinstance(value, (int, float)) and math.isfinite(value) and index < n_examples:
                taus[index] = float(value)
        if taus:
            ranked = sorted(taus, key=lambda i: (-taus[i], i))
            top = ranked[:count]
            bottom = [i for i in reversed(ranked[-count:]) if i not in top]
            how = f"the {len(top)} most and {len(bottom)} least faithful instances by {column} (importance test)"
            return top + bottom, taus, how
    chosen = list(range(min(2 * count, n_examples)))
    return chosen, {}, f"the first {len(chosen)} instances (the importance test's τ(attention, gradient) was not available)"


def item_labels(run: Run, batch: Batch) -> list[list[str]]:
    """The text of every explained item per instance: tokens, wordpieces (HF) or sentences (HAN)."""
    from attnaudit.importance import item_mask

    counts = item_mask(run, batch).sum(-1).tolist()
    wordpieces = run.model.wordpieces(batch)
    if wordpieces is not None:
        return [pieces[:n] for pieces, n in zip(wordpieces, counts)]
    labels = []
    for ex, n in zip(batch.examples, counts):
        if run.family == "han":
            labels.append([" ".join(s) for s in (ex.sentences or [ex.tokens])][:n])
        else:
            labels.append(list(ex.tokens[:n]))
    return labels


def _rationale_items(run: Run, batch: Batch, row: int) -> list[int]:
    """Items of instance ``row`` that belong to its rationale (HAN: sentences, HF: wordpieces of rationale words)."""
    from attnaudit.experiments.rationale import instance_units

    units = instance_units(run, batch, row)
    if units is None:
        return []
    return [i for i, u in enumerate(units.item_unit.tolist()) if u >= 0 and bool(units.positive[u])]


def compute_heatmaps(run: Run, examples: list[Example], indices: list[int], taus: dict[int, float]) -> list[dict[str, Any]]:
    """Scores of every supported explanation for ``examples[i]``, ``i`` in ``indices`` (one batch)."""
    from attnaudit.experiments.rationale import explanations

    if run.task.task_type not in ("classification", "pair"):
        raise AttnAuditError(f"heatmaps explain one decision per instance; a {run.task.task_type} model makes one per token")
    if not indices:
        return []
    methods = {m: fn for m, fn in explanations(run).items() if m in HEATMAP_METHODS}
    batch = next(iter(run.batches([examples[i] for i in indices], batch_size=len(indices))))
    run.model.eval()
    scores = {m: fn(run, batch).detach().cpu().double().numpy() for m, fn in methods.items()}
    with torch.no_grad():
        predicted = run.model(batch).probs.argmax(-1).tolist()
    labels = item_labels(run, batch)
    out = []
    for row, index in enumerate(indices):
        n = len(labels[row])
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
                "scores": {m: np.nan_to_num(values[row, :n], nan=0.0).tolist() for m, values in scores.items()},
            }
        )
    return out


def heatmaps_for(
    run: Run, examples: list[Example], results_dir: Path, count: int
) -> dict[str, Any]:
    """The ``heatmaps.json`` content for ``run``: chosen instances and how they were chosen."""
    path = results_dir / "importance.json"
    importance = Result.load(path) if path.exists() else None
    indices, taus, how = select_instances(importance, len(examples), count)
    return {"selection": how, "instances": compute_heatmaps(run, examples, indices, taus)}
