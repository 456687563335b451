"""Helpers shared by several tests: per-instance seeding, row means, instance rows, applicability reasons, shared plots.

Only generic pieces live here, each used by more than one test module: seeded generators,
attention-only reruns (layer resolution, a prepared batch, cache rows), means over heads and
real query rows, the identifying columns of per-instance rows, the reasons why a family of
tests does not apply, and figures drawn the same way by several tests. What several tests reuse
lives here too (``compare``: two models' attention and outputs, per instance; a rationale's scoring
units; the tagging study's published figures) or below the tests (the adversary sub-runs in
:mod:`attnaudit.training.attention_adversaries`): tests never import each other. This module
registers no test.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnaudit.algorithms.metrics import jsd, kl, row_mean, spearman, tvd
from attnaudit.data.types import Batch, Example, text_of, word_spans
from attnaudit.errors import AttnAuditError
from attnaudit.explain.helpers.attention import explained_attention
from attnaudit.explain.registry import remembered
from attnaudit.models.interface import (
    AttentionModel,
    AttentionTrace,
    Cache,
    ModelOutput,
    WeightsFn,
    evaluation,
)
from attnaudit.models.interface import (
    take_rows as take_query_rows,
)
from attnaudit.plotting import save_figure
from attnaudit.run import Run
from attnaudit.training.adversary import EVAL_BATCH
from attnaudit.training.trainer import InterventionsFn

ATTENTION_TABLE = "attention_examples"
"""Name of the result table holding the heatmap rows of :func:`attention_rows`."""

TAGGING_REASON = (
    "a tagger predicts one label per token, each from its own attention row; Jain & Wallace's "
    "tests perturb the one attention distribution behind one prediction, and there is no single "
    "distribution/prediction pair to perturb here (changing one row changes many outputs at once)"
)


# --------------------------------------------------------------------------- seeding


def seeded_generator(*keys: int) -> torch.Generator:
    """A CPU generator seeded from ``keys`` (e.g. seed, instance index) through a SeedSequence.

    Distinct key tuples give independent streams, so an instance's draws depend neither on
    batching nor on the other instances.
    """
    state = np.random.SeedSequence([int(k) for k in keys]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


# --------------------------------------------------------------------------- applicability


def single_attention_reason(run: Run) -> str | None:
    """Why the single-attention tests (permutation, adversarial) do not apply, or None."""
    if run.task.task_type == "tagging":
        return TAGGING_REASON
    if run.task.task_type == "seq2seq":
        return "a translation model has one attention distribution per target word, not one per prediction"
    return None


def transformer_classifier_reason(run: Run) -> str | None:
    """Why the key tests do not apply (None for a Transformer classifier)."""
    if run.family != "transformer":
        return (
            "the key tests (random, opposite and adversarial keys) train an MLP over the keys of the attnaudit "
            f"Transformer classifier's layers; this run is a {run.family!r} model"
        )
    return self_attention_classifier_reason(run)


def self_attention_classifier_reason(run: Run) -> str | None:
    """Why the normaliser swap and shuffling do not apply (None for a single-sentence classifier built
    of self-attention layers: the attnaudit Transformer or a Hugging Face encoder or decoder)."""
    if run.family not in ("transformer", "hf") or not run.model.self_attention:
        return (
            "the activation swap and shuffling tests change the weights of self-attention layers; "
            f"this run is a {run.family!r} model"
        )
    if run.task.task_type != "classification":
        return (
            "the sparse-attention tests score single-sentence classification accuracy; "
            f"this model was trained for task type {run.task.task_type!r}"
        )
    return None


# --------------------------------------------------------------------------- attention-only reruns


def resolve_layers(model: AttentionModel, spec: str, allow_all: bool = True) -> list[int]:
    """Absolute attention-layer indices for ``spec``: ``explained``, ``all`` or an index."""
    n = model.num_attention_layers
    if spec == "explained":
        return [model.explained_layer % n]
    if spec == "all":
        if not allow_all:
            raise AttnAuditError("--layer all is not supported by this test; give 'explained' or one layer index")
        return list(range(n))
    try:
        index = int(spec)
    except ValueError:
        raise AttnAuditError(f"--layer must be 'explained', 'all' or a layer index, got {spec!r}") from None
    if not -n <= index < n:
        raise AttnAuditError(f"--layer {index} is out of range: this model has {n} attention layer(s)")
    return [index % n]


@dataclass
class Explained:
    """One batch ready for attention-only reruns of ``layers`` (absolute indices, ascending).

    ``cache`` restarts the model at ``layers[0]``; ``weights[j]`` (B,H,Q,K) are the original
    weights of ``layers[j]``; ``key_mask`` (B,K) marks real items, ``query_rows`` (B,Q) the query
    rows an intervention changes (see :func:`prepare`); ``probs`` (B,C) the original output.
    ``positions`` (B,): where ``weights`` hold one row per example, the position it is in the
    full layer (a decoder's predicting token, :func:`full_rows`); else None.
    """

    cache: Cache
    layers: list[int]
    weights: list[Tensor]
    key_mask: Tensor
    query_rows: Tensor
    probs: Tensor
    positions: Tensor | None = None
    attention: Tensor | None = None
    """``(B,K)`` the ``attention`` explanation read from the same pass, when ``layers`` is the explained layer alone."""

    @property
    def size(self) -> int:
        """Number of instances in the batch."""
        return self.key_mask.shape[0]

    @property
    def reported(self) -> Tensor:
        """The weights the per-instance statistics describe: the last intervened layer."""
        return self.weights[-1]


BASE_PASS_BUDGET = 1 << 30
"""Bytes of plain passes an audit keeps for its tests to share (:func:`base_pass`); past them, each
test makes its own (500 SST-2 prompts through SmolLM2 take ~0.6 GB)."""


def base_pass(model: AttentionModel, batch: Batch, cache: Cache | None = None) -> ModelOutput:
    """``model(batch)`` without interventions (no gradient), once per batch within an audit
    (:func:`~attnaudit.explain.registry.remembered`, up to :data:`BASE_PASS_BUDGET`): its output and every
    layer's weights and masks, with the explained layer's whole record (:meth:`AttentionTrace.thinned`).
    Importance, rollout, the normaliser swap, the shuffle and the prepared pass of the single-attention
    tests read it. ``cache``: the batch's ``model.encode`` made in evaluation mode, when the caller has it
    (``model(batch)`` is ``decode(encode(batch))``: the batch is not encoded twice). The result is shared:
    callers must not change it in place."""

    def compute() -> ModelOutput:
        with evaluation(model), torch.no_grad():
            out = model(batch) if cache is None else model.decode(cache)
        return ModelOutput(out.logits, out.trace.thinned({model.explained_layer % len(out.trace)}))

    def size(out: ModelOutput) -> int:
        return out.trace.nbytes + out.logits.numel() * out.logits.element_size()

    return remembered(model, ("base",), batch, compute, size, BASE_PASS_BUDGET)


def prepare(model: AttentionModel, batch: Batch, layers: Sequence[int]) -> Explained:
    """:func:`prepare_pass`, once per batch and layers within an audit
    (:func:`~attnaudit.explain.registry.memoised`: permutation, faithfulness, erasure and adversarial
    share it). The result is shared: callers must not change it in place."""
    return remembered(model, ("prepared", tuple(layers)), batch, lambda: prepare_pass(model, batch, layers))


def prepare_pass(model: AttentionModel, batch: Batch, layers: Sequence[int]) -> Explained:
    """One full forward pass (the shared :func:`base_pass` for the explained layer): original output
    and weights, and a cache at ``layers[0]``.

    Every intervened layer must attend over the instance's items (one row per instance);
    HAN's word level, which attends within each sentence, is rejected with a clear message.

    Which query rows an intervention changes: all real ones, except at the last layer of a model
    whose decision reads one row of it (:func:`decision_rows`: [CLS] of an encoder, a decoder's last
    real token), where no other row reaches the output: there only that row, the one the
    ``attention`` explanation reads. A decoder then keeps that row alone (``Q = 1``) and restarts
    at that token only (:meth:`~attnaudit.models.hf.model.HFModel.rerun_cache`).
    """
    with torch.no_grad():
        base = model.encode(batch)
        explained = list(layers) == [model.explained_layer % model.num_attention_layers]
        encoded = None if model.training else base  # base_pass encodes in evaluation mode
        out = base_pass(model, batch, encoded) if explained and base.layer == 0 else model.decode(base)
    size = out.logits.shape[0]
    weights = []
    for layer in layers:
        entry = out.trace[layer - base.layer]
        if entry.weights.shape[0] != size:
            raise AttnAuditError(
                f"attention layer {layer} of this {model.config.model} model has {entry.weights.shape[0]} rows for "
                f"{size} instances (it attends within parts of the input); use --layer explained"
            )
        weights.append(entry.weights)
    last = out.trace[layers[-1] - base.layer]
    key_mask = last.mask.bool()
    q = last.weights.shape[2]
    query_rows = last.query_mask.bool() if last.query_mask is not None else key_mask.new_ones(size, q)
    attention = explained_attention(model, batch, out.trace) if explained else None
    rows = decision_rows(model, layers, key_mask)
    rows = None if rows is None else rows % q  # an encoder-decoder's forced target names its row from the end (-1)
    rerun = model.rerun_cache(out.trace, layers[0], base, rows) if rows is not None and layers[0] != base.layer else None
    if rows is not None and rerun is not None:
        picked = [take_query_rows(w, rows, 2)[:, :, None] for w in weights]
        return Explained(rerun, list(layers), picked, key_mask, key_mask.new_ones(size, 1), out.probs, rows, attention)
    if rows is not None:
        query_rows = torch.nn.functional.one_hot(rows, q).bool() & query_rows
    cache = base if layers[0] == base.layer else model.cache_at(out.trace, layers[0], base)
    return Explained(cache, list(layers), weights, key_mask, query_rows, out.probs, attention=attention)


def decision_rows(model: AttentionModel, layers: Sequence[int], key_mask: Tensor) -> Tensor | None:
    """``(B,)`` the one query row per example whose output the decision reads, when ``layers`` is the
    model's last attention layer alone and the model names that row (:meth:`AttentionModel.explanation_rows`:
    [CLS], a decoder's last real token); None otherwise (every row reaches the output)."""
    if list(layers) != [model.num_attention_layers - 1]:
        return None
    rows = model.explanation_rows(key_mask)
    if rows is None:
        return None
    if isinstance(rows, int):
        return torch.full((key_mask.shape[0],), rows, dtype=torch.long, device=key_mask.device)
    return rows.to(key_mask.device)


def full_rows(explained: Explained, weights: Tensor | WeightsFn) -> Tensor | WeightsFn:
    """A weight intervention made for ``explained``'s reruns as one on the full model: itself, or, where
    ``explained`` keeps one row per example (``positions``; then ``weights`` is a ``(B,H,1,K)`` tensor), a
    function putting each row in its place and leaving the other rows as the layer computes them
    (the reference loops, which rerun the whole model)."""
    positions = explained.positions
    if positions is None:
        return weights
    assert isinstance(weights, Tensor)  # the reruns at one position replace weights by tensors

    def put(computed: Tensor, _mask: Tensor) -> Tensor:
        out = computed.clone()
        index = torch.arange(out.shape[0], device=out.device)
        out[index, :, positions.to(out.device)] = weights[:, :, 0, : out.shape[-1]].to(out.dtype)
        return out

    return put


def take_rows(cache: Cache, rows: Tensor, size: int) -> Cache:
    """The cache restricted/repeated to instance ``rows`` (:meth:`Cache.select`), checked to hold one row per instance."""
    if cache.states.shape[0] != size:
        raise AttnAuditError(f"cache has {cache.states.shape[0]} rows, expected one per instance ({size})")
    return cache.select(rows)


# --------------------------------------------------------------------------- means and statistics


def max_attention(weights: Tensor, query_rows: Tensor) -> Tensor:
    """Per instance, the largest weight of each attention row, averaged over heads and real query rows.

    For single-query attention (the RNN family, HAN) this is just ``max α``, J&W's x-axis.
    """
    peak = weights.max(-1).values
    rows = query_rows[:, None, :].expand_as(peak).to(peak.dtype)
    return (peak * rows).sum((1, 2)) / rows.sum((1, 2)).clamp_min(1.0)


def layer_jsd(original: AttentionTrace, changed: AttentionTrace) -> list[Tensor]:
    """Per layer, the JSD between two traces' attention, mean over heads and real queries ``(B,)``."""
    out = []
    for a, b in zip(original.layers, changed.layers):
        qmask = a.query_mask if a.query_mask is not None else a.mask
        out.append(row_mean(jsd(a.weights, b.weights), qmask))
    return out


def weighted_mean(values: np.ndarray, weights: np.ndarray) -> float:
    """``Σ w·v / Σ w`` over finite values (token-level means from per-sentence means)."""
    keep = np.isfinite(values)
    total = float(weights[keep].sum())
    return float((values[keep] * weights[keep]).sum() / total) if total else float("nan")


def spearman_rho(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman ρ of two 1-D arrays; NaN with fewer than 3 pairs or a constant input."""
    if a.size < 3 or np.all(a == a[0]) or np.all(b == b[0]):
        return float("nan")
    return float(spearman(a, b)[0])


# --------------------------------------------------------------------------- per-instance rows


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


# --------------------------------------------------------------------------- plots


def plot_against_max_attention(
    frame: Any, value: str, xlabel: str, title: str, directory: Path, stem: str
) -> list[Path]:
    """``value`` against the instance's max attention, one panel per predicted class (J&W style).

    Instances are binned by max attention (tenths of [0, 1]); each bin is a horizontal box plot.
    """
    from attnaudit.plotting import pyplot

    plt = pyplot()

    frame = frame[np.isfinite(frame[value].astype(float))]
    classes = sorted(frame["predicted"].astype(str).unique()) or ["(none)"]
    fig, axes = plt.subplots(
        1, len(classes), figsize=(3.8 * len(classes), 3.6), sharey=True, squeeze=False, layout="constrained"
    )
    edges = np.linspace(0.0, 1.0, 11)
    labels = [f"{edges[b]:.1f}-{edges[b + 1]:.1f}" for b in range(10)]
    for ax, cls in zip(axes[0], classes):
        sub = frame[frame["predicted"].astype(str) == cls]
        bins = np.clip(np.digitize(sub["max_attention"].to_numpy(float), edges) - 1, 0, 9)
        values = sub[value].to_numpy(float)
        data = [(b, values[bins == b]) for b in range(10) if np.any(bins == b)]
        if data:
            ax.boxplot([d for _, d in data], positions=[b for b, _ in data], orientation="horizontal", widths=0.6)
        ax.set_yticks(range(10), labels)
        ax.set_ylim(-0.7, 9.7)
        ax.locator_params(axis="x", nbins=4)
        ax.set_xlabel(xlabel)
        ax.set_title(f"predicted {cls} (n={len(sub)})")
    axes[0][0].set_ylabel("max attention")
    fig.suptitle(title)
    return save_figure(fig, directory, stem)


def plot_histogram(values: Sequence[float], xlabel: str, title: str, directory: Path, stem: str, marker: float | None) -> list[Path]:
    """A histogram of the finite ``values``, with an optional vertical line at ``marker``."""
    from attnaudit.plotting import pyplot

    plt = pyplot()

    arr = np.asarray(values, dtype=float)
    arr = arr[np.isfinite(arr)]
    fig, ax = plt.subplots(figsize=(5, 3.4), layout="constrained")
    ax.hist(arr, bins=30, color="#4c72b0")
    if marker is not None:
        ax.axvline(marker, color="#c44e52", linestyle="--", label=f"{marker:g}")
        ax.legend()
    ax.set_xlabel(xlabel)
    ax.set_ylabel("instances")
    ax.set_title(f"{title} (n={arr.size})")
    return save_figure(fig, directory, stem)


def plot_attention_rows(rows: Sequence[Mapping[str, Any]], directory: Path, stem: str, title: str) -> list[Path]:
    """A grid of last-layer attention heatmaps (:func:`attention_rows`): one row per setting, one column per sentence."""
    from attnaudit.plotting import pyplot

    plt = pyplot()

    if not rows:
        return []
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    indices = sorted({int(r["index"]) for r in rows})
    by_key = {(r["setting"], int(r["index"])): r for r in rows}
    # One colour scale for the whole figure so that settings can be compared by eye.
    vmax = max(max(max(q) for q in r["weights"]) for r in rows) or 1.0
    fig, axes = plt.subplots(
        len(settings),
        len(indices),
        figsize=(3.0 * len(indices), 2.8 * len(settings)),
        squeeze=False,
        layout="constrained",
    )
    for r, setting in enumerate(settings):
        for c, index in enumerate(indices):
            ax = axes[r][c]
            row = by_key.get((setting, index))
            if row is None:
                ax.axis("off")
                continue
            image = ax.imshow(row["weights"], vmin=0.0, vmax=vmax, cmap="viridis")
            # Tick labels only under the bottom row (a column is one sentence): drawing
            # hundreds of tick labels dominates the plotting time.
            ax.set_yticks([])
            if r == len(settings) - 1:
                tokens = row["tokens"]
                ticks = list(range(0, len(tokens), max(1, -(-len(tokens) // 20))))
                ax.set_xticks(ticks, [tokens[t] for t in ticks], rotation=90, fontsize=6)
            else:
                ax.set_xticks([])
            if c == 0:
                ax.set_ylabel(setting, fontsize=9)
            if r == 0:
                ax.set_title(f"sentence {index}", fontsize=9)
    fig.colorbar(image, ax=axes, shrink=0.6)
    fig.suptitle(title + " (last layer, mean over heads; rows = queries, columns = keys)", fontsize=10)
    return save_figure(fig, directory, stem)


PUBLISHED_TAGGING = {
    "base_test_f1": 0.90,
    "f1@0.2": 0.90,
    "f1@3": 0.75,
    "breakpoint_kl": 0.33,
    "source": "CoNLL-2000 sequence-tagging attention study, 1-layer 4-head Transformer: Table 1 "
    "(original 0.90; adversary λ=0.2 0.90, λ=3 0.75) and the NLL-vs-KL figure (steep rise near KL ≈ 0.33)",
}


def compare(
    base: Run,
    other: AttentionModel,
    examples: Sequence[Example],
    interventions: InterventionsFn | None = None,
    batch_size: int = EVAL_BATCH,
) -> dict[str, np.ndarray]:
    """``other`` against the base model, one value per instance (both in eval mode, no gradient).

    Attention at the base's explained layer (same index in ``other``), averaged over heads
    and real query rows: ``jsd``, ``kl_base_other`` = KL(α_base ‖ α_other), ``kl_other_base``.
    Outputs (a tagger's averaged over real tokens): ``tvd`` of the predicted distributions,
    ``nll`` = −log p_other(base's predicted label), ``agreement`` = fraction of equal
    predicted labels. Also the base's and the other's ``max_attention`` / ``max_attention_other``
    (mean peak weight per row: 1 means one-hot attention), ``rows`` (real query rows) and
    ``outputs`` (predictions per instance: 1, or the tokens of a tagged sentence), the
    weights for token-level means.
    """
    layer = base.model.explained_layer
    tagging = base.task.task_type == "tagging"
    columns: dict[str, list[torch.Tensor]] = defaultdict(list)
    with evaluation(base.model), evaluation(other), torch.no_grad():
        for batch in base.batches(list(examples), batch_size):
            ours = base.model(batch)
            theirs = other(batch, interventions(batch) if interventions else ())
            mine, yours = ours.trace[layer], theirs.trace[layer]
            size, _, q, _ = mine.weights.shape
            rows = mine.query_mask.bool() if mine.query_mask is not None else mine.mask.new_ones(size, q, dtype=torch.bool)
            columns["jsd"].append(row_mean(jsd(yours.weights, mine.weights), rows))
            columns["kl_base_other"].append(row_mean(kl(mine.weights, yours.weights), rows))
            columns["kl_other_base"].append(row_mean(kl(yours.weights, mine.weights), rows))
            columns["max_attention"].append(max_attention(mine.weights, rows))
            columns["max_attention_other"].append(max_attention(yours.weights, rows))
            columns["rows"].append(rows.sum(-1).to(torch.float64))
            target = ours.logits.argmax(-1)
            nll = -theirs.logits.log_softmax(-1).gather(-1, target[..., None]).squeeze(-1)
            change = tvd(theirs.probs, ours.probs)
            agree = (theirs.logits.argmax(-1) == target).to(nll.dtype)
            if tagging:
                real = batch.mask.bool().to(nll.dtype)
                count = real.sum(-1).clamp_min(1.0)
                nll, change, agree = ((v * real).sum(-1) / count for v in (nll, change, agree))
                outputs = real.sum(-1)
            else:
                outputs = torch.ones_like(nll)
            columns["nll"].append(nll)
            columns["tvd"].append(change)
            columns["agreement"].append(agree)
            columns["outputs"].append(outputs.to(torch.float64))
    return {name: torch.cat(values).double().cpu().numpy() for name, values in columns.items()}


@dataclass
class Units:
    """How the items of one instance map onto scoring units and which units are rationale.

    ``item_unit[i]``: the unit of item ``i`` (-1: none, e.g. ``[CLS]``); ``positive``: bool per unit.
    """

    item_unit: np.ndarray
    positive: np.ndarray

    def scores(self, item_scores: np.ndarray) -> np.ndarray:
        """Per-unit magnitude: ``|score|`` summed over the unit's items."""
        out = np.zeros(self.positive.size)
        keep = self.item_unit >= 0
        np.add.at(out, self.item_unit[keep], np.abs(item_scores[: self.item_unit.size][keep]))
        return out


def _hf_word_ids(run: Run, ex: Example, ids: list[int]) -> np.ndarray | None:
    """Word index of each wordpiece of ``ex`` (-1 for special tokens, the query and pieces of no word), from the
    tokenizer's character offsets into the text as the collator gave it (:func:`~attnaudit.data.types.text_of`)
    and the words' spans in it; None if it cannot be aligned."""
    tokenizer = run.model.tokenizer  # called for the hf family only
    spans = word_spans(ex)
    if not getattr(tokenizer, "is_fast", False) or spans is None:
        return None
    pair = [text_of(ex, query=True)] if run.task.task_type == "pair" and ex.query else None
    enc = tokenizer([text_of(ex)], pair, truncation=True, max_length=len(ids), return_offsets_mapping=True)
    if enc["input_ids"][0] != ids:
        return None  # the collator tokenised differently (a prompt, a cut): no safe alignment
    starts = [a for a, _ in spans]
    owners = []
    for sequence, (a, b) in zip(enc.sequence_ids(0), enc["offset_mapping"][0]):
        word = bisect.bisect_right(starts, max(b - 1, a)) - 1  # the word holding the piece's last character
        inside = sequence == 0 and b > a and word >= 0 and a < spans[word][1] and b > spans[word][0]
        owners.append(word if inside else -1)
    return np.array(owners, dtype=int)


def instance_units(run: Run, batch: Batch, row: int) -> Units | None:
    """Scoring units of instance ``row`` of ``batch``; None when the example has no usable rationale."""
    ex = batch.examples[row]
    rationale = set(ex.rationale or [])
    if not rationale:
        return None
    mask = batch.mask[row]
    if run.family == "han":
        n_sent = int(mask.any(-1).sum())
        lengths = [len(s) for s in (ex.sentences or [ex.tokens])][:n_sent]
        starts = np.cumsum([0, *lengths])
        positive = np.array([any(a <= r < b for r in rationale) for a, b in zip(starts[:-1], starts[1:])])
        return Units(np.arange(n_sent), positive)
    n_items = int(mask.sum())
    if run.family == "hf":
        word_of = _hf_word_ids(run, ex, batch.tokens[row, :n_items].tolist())
        if word_of is None:
            return None
        n_words = int(word_of.max()) + 1 if (word_of >= 0).any() else 0
        return Units(word_of, np.isin(np.arange(n_words), list(rationale)))
    n_words = min(n_items, len(ex.tokens))
    return Units(np.arange(n_words), np.isin(np.arange(n_words), list(rationale)))
