"""Per-instance rows: the key axis's tokens, gold labels, the identifying columns of every row, and the attention heatmap rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnaudit.data.types import Batch, Example
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.common.measures import max_attention
from attnaudit.experiments.common.passes import Explained
from attnaudit.models.interface import (
    AttentionTrace,
    evaluation,
)
from attnaudit.run import Run
from attnaudit.training.adversary import EVAL_BATCH

ATTENTION_TABLE = "attention_examples"
"""Name of the result table holding the heatmap rows of :func:`attention_rows`."""


def key_tokens(run: Run, batch: Batch) -> list[list[str]]:
    """The string of every position on the attention key axis ("" at padding).

    Hugging Face models: wordpieces. Our Transformer: the example's tokens; for pair
    tasks the text (padded to the batch width) followed by the query, as the model lays
    them out.
    """
    width = batch.mask.shape[-1] if batch.query is None else batch.tokens.shape[1] + batch.query.shape[1]
    wordpieces = run.model.wordpieces(batch)
    out: list[list[str]] = []
    if wordpieces is not None:
        for pieces in wordpieces:
            out.append(pieces + [""] * (width - len(pieces)))
        return out
    text_width = batch.tokens.shape[1]
    for i, ex in enumerate(batch.examples):
        n = int(batch.mask[i].sum())
        row = list(ex.tokens[:n]) + [""] * (text_width - n)
        if batch.query is not None and batch.query_mask is not None:
            q = int(batch.query_mask[i].sum())
            row += list((ex.query or [])[:q]) + [""] * (batch.query.shape[1] - q)
        out.append(row)
    return out


def batch_labels(batch: Batch) -> Tensor:
    """Gold label ids of a classification batch (the tests need labelled data)."""
    if batch.labels is None:
        raise AttnAuditError("this test needs labelled examples; the split has no labels")
    return batch.labels


def instance_rows(
    run: Run, examples: Sequence[Example], explained: Explained, indices: Sequence[int]
) -> list[dict[str, Any]]:
    """The identifying columns every per-instance row of a rerun test starts with.

    ``indices`` are the batch's instances' positions in the split; ``items`` counts the
    real keys and ``max_attention`` is read from ``explained`` (see :func:`max_attention`).
    """
    predicted = explained.probs.argmax(-1).tolist()
    peaks = max_attention(explained.reported, explained.query_rows).tolist()
    items = explained.key_mask.sum(-1).tolist()
    return [
        {
            "index": indices[i],
            "source": str(ex.meta.get("source", "")),
            "label": ex.label,
            "predicted": run.labels[predicted[i]] if predicted[i] < len(run.labels) else str(predicted[i]),
            "items": int(items[i]),
            "max_attention": float(peaks[i]),
        }
        for i, ex in enumerate(examples)
    ]


def identity_rows(run: Run, examples: Sequence[Example], comparison: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
    """The columns every per-instance row of a model-comparison test starts with.

    ``predicted`` is the base model's class (one panel, ``tokens``, for a tagger); ``items``
    is the number of tokens and ``max_attention`` is read from ``comparison`` (as returned by
    :func:`attnaudit.experiments.seeds.compare`).
    """
    tagging = run.task.task_type == "tagging"
    predicted: list[str] = []
    if not tagging:
        with evaluation(run.model), torch.no_grad():
            for batch in run.batches(list(examples), EVAL_BATCH):
                predicted += [run.labels[i] for i in run.model(batch).logits.argmax(-1).tolist()]
    return [
        {
            "index": i,
            "source": str(ex.meta.get("source", "")),
            "label": ex.label if not tagging else "",
            "predicted": "tokens" if tagging else predicted[i],
            "items": len(ex.tokens),
            "max_attention": float(comparison["max_attention"][i]),
        }
        for i, ex in enumerate(examples)
    ]


def attention_rows(
    run: Run, batch: Batch, trace: AttentionTrace, setting: str, show: int, indices: Sequence[int]
) -> list[dict[str, Any]]:
    """Head-mean attention of the last layer for the first ``show`` instances of the split.

    ``indices`` are the positions of ``batch``'s instances in the split; rows hold the real
    tokens (:func:`key_tokens`: wordpieces for a Hugging Face model) and the ``(n, n)`` matrix,
    so plots can be drawn from a saved result alone.
    """
    rows = []
    weights = trace.layers[-1].weights.mean(1)
    tokens = key_tokens(run, batch) if min(indices, default=show) < show else []
    for i, index in enumerate(indices):
        if index >= show:
            continue
        n = int(batch.mask[i].sum())
        rows.append(
            {
                "index": index,
                "setting": setting,
                "tokens": tokens[i][:n],
                "weights": weights[i, :n, :n].tolist(),
            }
        )
    return rows
