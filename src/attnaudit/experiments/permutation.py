"""Permutation test (Jain & Wallace 2019, §4.2.1): shuffle attention, measure the output change.

For every instance the explained attention is shuffled over the real items (padding stays
at zero) ``--permutations`` times while everything before attention is held fixed: the
batch is encoded once (:meth:`AttentionModel.encode`) and only the attention layer and what
follows it is rerun (:meth:`AttentionModel.decode`) with ``Intervention(weights=permuted)``.
All permutations of a batch of instances go through a few large ``decode`` calls. The
statistic per instance is the median output change (:func:`attnaudit.metrics.output_change`)
over its permutations; a small median means the prediction does not depend on *which* item
received which weight.

The helpers here (layer resolution, seeded per-instance draws, cache row selection, plots)
are shared with :mod:`attnaudit.experiments.adversarial`, which reruns ``decode`` the same way.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnaudit.data.types import Batch, Example
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.base import Experiment, Result, register, save_figure, summarise
from attnaudit.metrics import output_change
from attnaudit.models.base import AttentionModel, Cache, Intervention, evaluation
from attnaudit.progress import track
from attnaudit.run import Run

# Elements (weights + repeated states) allowed in one decode call; bounds memory on long inputs.
DECODE_BUDGET = 2**20

TAGGING_REASON = (
    "a tagger predicts one label per token, each from its own attention row; Jain & Wallace's "
    "tests perturb the one attention distribution behind one prediction, and there is no single "
    "distribution/prediction pair to perturb here (changing one row changes many outputs at once)"
)


# --------------------------------------------------------------------------- shared helpers


def not_applicable(run: Run) -> str | None:
    """Why the single-attention tests (permutation, adversarial) do not apply, or None."""
    if run.task.task_type == "tagging":
        return TAGGING_REASON
    if run.task.task_type == "seq2seq":
        return "a translation model has one attention distribution per target word, not one per prediction"
    return None


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


def instance_generator(seed: int, index: int) -> torch.Generator:
    """A CPU generator for instance ``index``: its draws do not depend on batching or on other instances."""
    state = np.random.SeedSequence([seed, index]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


@dataclass
class Explained:
    """One batch ready for attention-only reruns of ``layers`` (absolute indices, ascending).

    ``cache`` restarts the model at ``layers[0]``; ``weights[j]`` (B,H,Q,K) are the original
    weights of ``layers[j]``; ``key_mask`` (B,K) marks real items, ``query_rows`` (B,Q) real
    query rows (all rows for single-query attention); ``probs`` (B,C) the original output.
    """

    cache: Cache
    layers: list[int]
    weights: list[Tensor]
    key_mask: Tensor
    query_rows: Tensor
    probs: Tensor

    @property
    def size(self) -> int:
        return self.key_mask.shape[0]

    @property
    def reported(self) -> Tensor:
        """The weights the per-instance statistics describe: the last intervened layer."""
        return self.weights[-1]


def prepare(model: AttentionModel, batch: Batch, layers: Sequence[int]) -> Explained:
    """One full forward pass: original output and weights, and a cache at ``layers[0]``.

    Every intervened layer must attend over the instance's items (one row per instance);
    HAN's word level, which attends within each sentence, is rejected with a clear message.
    """
    with torch.no_grad():
        base = model.encode(batch)
        out = model.decode(base)
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
    cache = base if layers[0] == base.layer else model.cache_at(out.trace, layers[0], base)
    return Explained(cache, list(layers), weights, key_mask, query_rows, out.probs)


def take_rows(cache: Cache, rows: Tensor, size: int) -> Cache:
    """The cache restricted/repeated to instance ``rows`` (per-instance ``extra`` tensors too)."""
    if cache.states.shape[0] != size:
        raise AttnAuditError(f"cache has {cache.states.shape[0]} rows, expected one per instance ({size})")

    def pick(value: Any) -> Any:
        if isinstance(value, Tensor) and value.dim() and value.shape[0] == size:
            return value.index_select(0, rows)
        return value

    extra = {key: pick(value) for key, value in cache.extra.items()}
    return Cache(cache.states.index_select(0, rows), cache.mask.index_select(0, rows), cache.layer, extra)


def rows_per_call(explained: Explained) -> int:
    """How many (instance, permutation) rows one decode call may take within :data:`DECODE_BUDGET`."""
    _, h, q, k = explained.reported.shape
    per_row = len(explained.layers) * h * q * k + explained.cache.states[0].numel()
    return max(1, DECODE_BUDGET // max(per_row, 1))


def max_attention(weights: Tensor, query_rows: Tensor) -> Tensor:
    """Per instance, the largest weight of each attention row, averaged over heads and real query rows.

    For single-query attention (the RNN family, HAN) this is just ``max α``, J&W's x-axis.
    """
    peak = weights.max(-1).values
    rows = query_rows[:, None, :].expand_as(peak).to(peak.dtype)
    return (peak * rows).sum((1, 2)) / rows.sum((1, 2)).clamp_min(1.0)


def row_mean(values: Tensor, query_rows: Tensor) -> Tensor:
    """Mean of ``values`` (..., H, Q) over heads and real query rows; ``query_rows`` (B,Q) leads."""
    rows = query_rows.view(query_rows.shape[0], *([1] * (values.dim() - 3)), 1, query_rows.shape[1])
    rows = rows.expand_as(values).to(values.dtype)
    return (values * rows).sum((-1, -2)) / rows.sum((-1, -2)).clamp_min(1.0)


def instance_rows(
    run: Run, examples: Sequence[Example], explained: Explained, offset: int
) -> list[dict[str, Any]]:
    """The identifying columns every per-instance row starts with."""
    predicted = explained.probs.argmax(-1).tolist()
    peaks = max_attention(explained.reported, explained.query_rows).tolist()
    items = explained.key_mask.sum(-1).tolist()
    return [
        {
            "index": offset + i,
            "source": str(ex.meta.get("source", "")),
            "label": ex.label,
            "predicted": run.labels[predicted[i]] if predicted[i] < len(run.labels) else str(predicted[i]),
            "items": int(items[i]),
            "max_attention": float(peaks[i]),
        }
        for i, ex in enumerate(examples)
    ]


def plot_against_max_attention(
    frame: Any, value: str, xlabel: str, title: str, directory: Path, stem: str
) -> list[Path]:
    """``value`` against the instance's max attention, one panel per predicted class (J&W style).

    Instances are binned by max attention (tenths of [0, 1]); each bin is a horizontal box plot.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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


# --------------------------------------------------------------------------- permutations


PERMUTATION_BLOCK = 16
"""Permutations drawn per random call; fixed, so the draws never depend on batching."""


def permutation_blocks(
    key_mask: Tensor, query_rows: Tensor, heads: int, layers: int, count: int, generator: torch.Generator
) -> Iterator[Tensor]:
    """``count`` permutations of one instance as source indices, in blocks ``(block, layers, H, Q, K)``.

    ``new[..., j] = old[..., src[..., j]]``: each real query row of each head and layer gets
    its own uniform shuffle of the real keys; padding keys and padding query rows map to
    themselves. The draws depend only on the numbers of real keys and rows (and ``count``),
    so an instance gets the same permutations alone or padded in a batch. Blocks of
    :data:`PERMUTATION_BLOCK` keep memory bounded on long inputs.
    """
    k, q = key_mask.shape[0], query_rows.shape[0]
    real = key_mask.nonzero().squeeze(-1)
    rows = query_rows.nonzero().squeeze(-1)
    for start in range(0, count, PERMUTATION_BLOCK):
        size = min(PERMUTATION_BLOCK, count - start)
        order = torch.rand(size, layers, heads, rows.numel(), real.numel(), generator=generator).argsort(-1)
        src = torch.arange(k).expand(size, layers, heads, q, k).clone()
        src[:, :, :, rows[:, None], real] = real[order]
        yield src


def permutation_interventions(explained: Explained, instances: Tensor, sources: Tensor) -> list[Intervention]:
    """Interventions for rows of ``instances`` with ``sources`` (rows, layers, H, Q, K).

    One layer: the permuted original weights as a tensor. Several layers: each layer's
    *computed* weights are permuted (earlier permutations change later layers' inputs).
    """
    if len(explained.layers) == 1:
        original = explained.weights[0].index_select(0, instances)
        return [Intervention(layer=explained.layers[0], weights=original.gather(-1, sources[:, 0]))]
    return [
        Intervention(layer=layer, weights=lambda w, _m, src=sources[:, j]: w.gather(-1, src))
        for j, layer in enumerate(explained.layers)
    ]


@dataclass
class PermutationOutcome:
    """Per-instance results of one batch: ``changes``/``flips`` (B, permutations)."""

    explained: Explained
    changes: Tensor
    flips: Tensor
    decode_calls: int


def permute_batch(
    model: AttentionModel, batch: Batch, layers: Sequence[int], permutations: int, seed: int, indices: Sequence[int]
) -> PermutationOutcome:
    """Output change of every permutation of every instance in ``batch`` (encode once, batched decode).

    ``indices`` are the instances' positions in the whole evaluation set; with ``seed`` they
    fix each instance's permutations. Permutations of consecutive instances are pooled into
    decode calls of about :func:`rows_per_call` rows.
    """
    explained = prepare(model, batch, layers)
    size = explained.size
    heads = explained.reported.shape[1]
    device = explained.key_mask.device
    key_mask, query_rows = explained.key_mask.cpu(), explained.query_rows.cpu()
    changes = torch.zeros(size, permutations)
    flips = torch.zeros(size, permutations)
    original = explained.probs.argmax(-1)
    chunk = rows_per_call(explained)
    pending: list[tuple[int, int, Tensor]] = []  # (instance, first permutation, sources block)
    calls = rows = 0

    def flush() -> None:
        nonlocal calls, rows
        if not pending:
            return
        inst = torch.cat([torch.full((len(src),), i) for i, _, src in pending])
        perm = torch.cat([torch.arange(p, p + len(src)) for _, p, src in pending])
        sources = torch.cat([src for _, _, src in pending]).to(device)
        instances = inst.to(device)
        out = model.decode(take_rows(explained.cache, instances, size), permutation_interventions(explained, instances, sources))
        calls += 1
        changes[inst, perm] = output_change(out.probs, explained.probs.index_select(0, instances)).float().cpu()
        flips[inst, perm] = (out.probs.argmax(-1) != original.index_select(0, instances)).float().cpu()
        pending.clear()
        rows = 0

    with torch.no_grad():
        for i, index in enumerate(indices):
            first = 0
            blocks = permutation_blocks(key_mask[i], query_rows[i], heads, len(layers), permutations, instance_generator(seed, index))
            for src in blocks:
                pending.append((i, first, src))
                first += len(src)
                rows += len(src)
                if rows >= chunk:
                    flush()
        flush()
    return PermutationOutcome(explained, changes, flips, calls)


def permutation_loop(
    run: Run, examples: Sequence[Example], layers: Sequence[int], permutations: int, seed: int
) -> np.ndarray:
    """Reference: one instance at a time, the FULL model rerun for every permutation.

    Draws exactly the permutations :func:`permute_batch` draws (same seed and indices), so the
    two must agree; used by the tests and ``benchmarks/bench_permutation.py``. Returns the
    output changes ``(instances, permutations)``.
    """
    model = run.model
    changes = np.zeros((len(examples), permutations))
    zero = torch.zeros(1, dtype=torch.long, device=run.device)
    with evaluation(model), torch.no_grad():
        for index, example in enumerate(examples):
            batch = run.collate([example]).to(run.device)
            explained = prepare(model, batch, layers)
            heads = explained.reported.shape[1]
            key_mask, query_rows = explained.key_mask[0].cpu(), explained.query_rows[0].cpu()
            generator = instance_generator(seed, index)
            p = 0
            for block in permutation_blocks(key_mask, query_rows, heads, len(layers), permutations, generator):
                for src in block.to(run.device):
                    out = model(batch, permutation_interventions(explained, zero, src[None]))
                    changes[index, p] = float(output_change(out.probs, explained.probs)[0])
                    p += 1
    return changes


@register
class Permutation(Experiment):
    """Jain & Wallace's permutation test on the explained attention layer."""

    name = "permutation"
    description = (
        "Shuffle the explained attention over the real items (encoder states fixed) many times per "
        "instance; report the median output change."
    )
    paper = "Jain & Wallace 2019 (Attention is not Explanation), §4.2.1, Fig. 4"

    @dataclass
    class Options:
        permutations: int = field(default=100, metadata={"help": "Permutations per instance."})
        layer: str = field(
            default="explained",
            metadata={
                "help": "Layer to permute: 'explained' (the model's: last for Transformers, sentence level for HAN), "
                "a layer index, or 'all' (every layer at once; Transformers)."
            },
        )
        threshold: float = field(
            default=0.05, metadata={"help": "An instance is permutation-insensitive when its median change is below this."}
        )
        batch_size: int = field(default=32, metadata={"help": "Instances encoded together."})

    def applies(self, run: Run) -> str | None:
        return not_applicable(run)

    def run(self, run: Run, examples: list[Example], options: Any, seed: int = 0) -> Result:
        if options.permutations < 1 or options.batch_size < 1:
            raise AttnAuditError("--permutations and --batch-size must be at least 1")
        if options.threshold < 0:
            raise AttnAuditError(f"--threshold must be non-negative, got {options.threshold}")
        layers = resolve_layers(run.model, options.layer)
        rows: list[dict[str, Any]] = []
        calls = forwards = 0
        offset = 0
        with evaluation(run.model):
            batches = run.batches(examples, options.batch_size)
            for batch in track(batches, "permutation", total=math.ceil(len(examples) / options.batch_size)):
                indices = range(offset, offset + len(batch))
                outcome = permute_batch(run.model, batch, layers, options.permutations, seed, indices)
                calls += outcome.decode_calls
                forwards += 1
                for row, changes, flips in zip(
                    instance_rows(run, batch.examples, outcome.explained, offset), outcome.changes, outcome.flips
                ):
                    single = row["items"] < 2
                    nan = float("nan")
                    row.update(
                        {
                            "median_change": nan if single else float(changes.median()),
                            "mean_change": nan if single else float(changes.mean()),
                            "max_change": nan if single else float(changes.max()),
                            "flip_rate": nan if single else float(flips.mean()),
                        }
                    )
                    rows.append(row)
                offset += len(batch)
        return self._result(run, rows, options, layers, calls, forwards)

    def _result(
        self, run: Run, rows: list[dict[str, Any]], options: Any, layers: list[int], calls: int, forwards: int
    ) -> Result:
        medians = [r["median_change"] for r in rows]
        stats = summarise(medians)
        evaluated = [m for m in medians if math.isfinite(m)]
        insensitive = [m < options.threshold for m in evaluated]
        single = sum(r["items"] < 2 for r in rows)
        summary = {
            "n": len(rows),
            "n_evaluated": len(evaluated),
            "n_single_item": single,
            "median_change_mean": stats["mean"],
            "median_change_median": stats["median"],
            "median_change_std": stats["std"],
            "fraction_insensitive": float(np.mean(insensitive)) if insensitive else float("nan"),
            "threshold": options.threshold,
            "flip_rate_mean": summarise([r["flip_rate"] for r in rows])["mean"],
            "permutations": options.permutations,
        }
        per_class = []
        for cls in sorted({r["predicted"] for r in rows}):
            values = [r["median_change"] for r in rows if r["predicted"] == cls and math.isfinite(r["median_change"])]
            class_stats = summarise(values)
            per_class.append(
                {
                    "predicted": cls,
                    "n": class_stats["n"],
                    "median_change_mean": class_stats["mean"],
                    "median_change_median": class_stats["median"],
                    "fraction_insensitive": float(np.mean([v < options.threshold for v in values])) if values else float("nan"),
                }
            )
        notes = [
            f"permuted attention layer(s) {layers} ({options.layer}); encoder states fixed: encoded once, "
            f"then {calls} batched decode call(s) for {len(rows) * options.permutations} permutations",
            "output change: |Δp| of the positive class for binary models, total variation distance otherwise",
            f"{single} instance(s) with fewer than two items have no distinct permutation and are excluded (NaN)",
            "max_attention: the instance's largest attention weight (multi-head / self-attention: each row's maximum, "
            "averaged over heads and real query rows)",
        ]
        if len(layers) > 1:
            notes.append("several layers: each layer's computed weights are permuted, so later layers see changed inputs")
        return Result(
            test=self.name,
            summary=summary,
            instances=rows,
            tables={"per_class": per_class},
            meta={
                "notes": notes,
                "layers": layers,
                "decode_calls": calls,
                "full_forward_passes": len(rows),
                "encode_batches": forwards,
                "published": {
                    "source": "Jain & Wallace 2019, Fig. 4 (median output change vs max attention, BiLSTM encoders)",
                    "finding": "on most text-classification datasets the median output change under permutation "
                    "is small even where attention is peaked; Diabetes and the QA/NLI tasks are the exceptions "
                    "where permuting peaked attention changes predictions",
                },
            },
        )

    def verdict(self, result: Result) -> list[dict[str, Any]]:
        """Share of instances whose output hardly moves when attention is permuted (J&W's Fig. 4 reading)."""
        s = result.summary
        share, median, threshold = s.get("fraction_insensitive"), s.get("median_change_median"), s.get("threshold")
        if not isinstance(share, (int, float)) or not math.isfinite(share) or not isinstance(threshold, (int, float)):
            return super().verdict(result)
        if share >= 0.5:
            meaning = (
                f"{share:.0%} of instances change their output by less than {threshold:g} when attention is "
                "permuted: the prediction barely depends on which item gets which weight, so high weights "
                "need not mark what the decision rests on"
            )
        else:
            meaning = (
                f"only {share:.0%} of instances are insensitive (output change < {threshold:g}); permuting "
                "attention changes most outputs: the model depends on where its attention falls"
            )
        return [
            {"statistic": "fraction_insensitive", "value": share, "published": "", "interpretation": meaning},
            {
                "statistic": "median_change_median",
                "value": median,
                "published": "small for most text classification (J&W 2019, Fig. 4)",
                "interpretation": f"median over instances of the median output change: {median:.3g}"
                if isinstance(median, (int, float)) and math.isfinite(median)
                else "",
            },
        ]

    def plot(self, result: Result, directory: Path) -> list[Path]:
        frame = result.frame()
        if frame.empty:
            return []
        paths = plot_against_max_attention(
            frame,
            "median_change",
            "median output change under permutation",
            "Permutation: output change vs max attention",
            directory,
            "permutation_vs_max_attention",
        )
        paths += plot_histogram(
            frame["median_change"].tolist(),
            "median output change",
            "Permutation",
            directory,
            "permutation_histogram",
            result.summary.get("threshold"),
        )
        return paths
