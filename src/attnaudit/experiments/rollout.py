"""Raw attention vs attention rollout vs attention flow as token importance (Abnar & Zuidema 2020).

Per layer ``l`` each method gives one score per input token: raw attention of layer ``l``
(heads averaged), rollout ``R_l = Â_l ⋯ Â_1`` and max-flow through ``Â`` (both with the
residual adjustment ``Â = ½I + ½A``, :mod:`attnaudit.algorithms.attention_graph`); the score vector is read off
the explanation row (``[CLS]`` for Hugging Face models; the mean over real queries for our
mean-pooled Transformer), or, with ``--query max``, the maximum over query rows as in
Abnar & Zuidema's DistilBERT script.

These maps need no prediction, so they are computed for any encoder, a pretrained one
without a classification head included: table ``maps`` holds each instance's token scores
per layer and method, table ``map_layers`` their per-layer summaries (normalised entropy,
share on ``[CLS]``/``[SEP]``, Spearman ρ with raw attention of the same layer). When the
model makes a prediction (a trained head), each map is also rank-correlated (Spearman, per
instance; table ``layers``) with reference importance scores for the predicted class:

* ``gradient``: J&W's ``|Σ_d ∂ŷ/∂e·e|`` with attention detached (:mod:`attnaudit.explain.methods.gradient`);
* ``loo``: leave-one-out output change when a token is removed (:mod:`attnaudit.explain.methods.loo`);
* ``input_gradient``: ``|Σ_d ∂z/∂e|``, the gradient of the predicted logit with attention
  left live — the "input gradients" of Abnar & Zuidema's released code;
* any other explanation of the prediction (:mod:`attnaudit.explain`, those needing one).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np
import torch
from torch import Tensor

from attnaudit.algorithms.attention_graph import flow, rollout
from attnaudit.algorithms.metrics import entropy_rows, spearman_rows
from attnaudit.data.types import Example
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.common.passes import base_pass
from attnaudit.experiments.common.rows import key_tokens
from attnaudit.experiments.experiment import AuditSettings, Experiment, Result, counted, joined, register, summarise, where
from attnaudit.explain import EXPLANATIONS, Explanation, applying, item_mask
from attnaudit.models.interface import AttentionModel, take_rows
from attnaudit.plotting import save_figure
from attnaudit.progress import track
from attnaudit.run import Run

METHODS = ("raw", "rollout", "flow")
MAP_STATISTICS = {
    "entropy": "normalised entropy (1 = even)",
    "special_share": "share on [CLS]/[SEP]",
    "vs_raw": "Spearman ρ with raw attention",
}
"""Per-layer summaries of the maps (instance columns ``L{layer}_{method}_{statistic}``), with plot titles."""
NO_PREDICTION = (
    "no importance comparison: this model has no trained classification head, so it makes no prediction to "
    "explain; the result holds the maps and their per-layer summaries only (fine-tune it with attnaudit finetune "
    "to compare them with gradient / leave-one-out importance)"
)

# Abnar & Zuidema (2020), Table 3: Spearman ρ (mean ± std over 100 SST-2 test sentences) between
# attention-based importance and input gradients, DistilBERT fine-tuned on SST-2. Their L1..L6
# are our 0-based layers 0..5; L2 and L4 were not reported.
PUBLISHED = {
    "paper": "Abnar & Zuidema 2020, Quantifying Attention Flow in Transformers (ACL), Table 3",
    "setting": "DistilBERT fine-tuned on SST-2, 100 test sentences; importance = input gradients of one class, "
    "attention not detached (not |Σ_d ∂ logit / ∂ e| over the input embeddings, our `input_gradient`'s default: "
    "DistilBERT's embedding LayerNorm makes that sum 0); token score = max over query rows in their released script "
    "(our --query max); all wordpieces incl. [CLS]/[SEP]",
    "input_gradient": {
        "L1": {"raw": [0.12, 0.21], "rollout": [0.11, 0.19], "flow": [0.11, 0.19]},
        "L3": {"raw": [0.09, 0.21], "rollout": [0.12, 0.21], "flow": [0.11, 0.21]},
        "L5": {"raw": [0.08, 0.20], "rollout": [0.13, 0.21], "flow": [0.12, 0.22]},
        "L6": {"raw": [0.09, 0.21], "rollout": [0.13, 0.20], "flow": [0.14, 0.21]},
    },
    "verb_number_6layer_blank_out_L6": {"raw": 0.29, "rollout": 0.71, "flow": 0.70},
    "verb_number_6layer_input_gradients_L6": {"raw": 0.46, "rollout": 0.54, "flow": 0.61},
}


def explanation_rows(matrices: Tensor, mask: Tensor, query: str, cls_index: int | Tensor | None) -> Tensor:
    """``(B, L, T, T)`` -> ``(B, L, T)``: the row(s) of each layer's matrix that explain the prediction.

    ``query``: ``cls`` (row ``cls_index``: one for all, or one per example ``(B,)`` — a decoder's
    last real token; without one, the mean over real queries), ``mean`` or ``max`` over real
    query rows. Padded keys come out 0.
    """
    keys = mask[:, None, :].to(matrices.dtype)
    if query == "cls" and isinstance(cls_index, Tensor):
        return take_rows(matrices, cls_index, 2) * keys
    if query == "cls" and cls_index is not None:
        return matrices[:, :, cls_index, :] * keys
    rows = mask[:, None, :, None]
    if query == "max":
        return matrices.masked_fill(~rows, float("-inf")).amax(2).clamp_min(0.0) * keys
    m = rows.to(matrices.dtype)
    return (matrices * m).sum(2) / m.sum(2).clamp_min(1.0) * keys


def map_statistics(
    matrix: np.ndarray, raw: np.ndarray | None, keep: np.ndarray, items: np.ndarray, special: np.ndarray | None
) -> dict[str, np.ndarray]:
    """The :data:`MAP_STATISTICS` of one instance's token scores ``matrix`` ``(L, K)``, per layer.

    Entropy and ρ with the ``raw`` attention scores of the same layer (None for raw itself) over
    the ``keep`` tokens; the share on ``special`` tokens (None: the model has none) over all ``items``.
    """
    stats = {"entropy": entropy_rows(matrix[:, keep])}
    if special is not None:
        total = matrix[:, items].sum(1)
        with np.errstate(invalid="ignore", divide="ignore"):
            stats["special_share"] = np.where(total > 0, matrix[:, items & special].sum(1) / total, np.nan)
    if raw is not None:
        stats["vs_raw"] = spearman_rows(matrix[:, keep], raw[:, keep])
    return stats


def layer_table(instances: list[dict[str, Any]], n_layers: int, names: list[str], column: str) -> list[dict[str, Any]]:
    """Per layer, method and name: :func:`summarise` of the instance values ``L{layer}_{method}_{name}``."""
    table = []
    for layer in range(n_layers):
        for method in METHODS:
            for name in names:
                if method == "raw" and name == "vs_raw":
                    continue
                key = f"L{layer}_{method}_{name}"
                stats = summarise([row[key] for row in instances if key in row])
                table.append({"layer": layer, "paper_layer": f"L{layer + 1}", "method": method, column: name, **stats})
    return table


def _finite(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


DEFAULT_IMPORTANCE = ("gradient", "loo", "input_gradient")
"""The reference importances compared by default; one that does not apply to a model is left out with a note."""


@register
class Rollout(Experiment):
    """The test of this module (its docstring gives the method, options and outputs)."""

    name = "rollout"
    settings = AuditSettings(
        rank=5,
        options={"flow_limit": 20},
        decoder_options={"flow_limit": 2, "importance": ["gradient"], "batch_size": 8},
        demo={"full": {"flow_limit": 20}, "quick": {"flow_limit": 2, "importance": ["gradient"]}},
    )
    # an LLM: 30 layers of flow per instance, and each reference costs passes of a 135M model
    description = (
        "raw attention, rollout and flow maps per layer, vs gradient / leave-one-out importance when the model "
        "predicts (Abnar & Zuidema)"
    )
    paper = "Abnar & Zuidema 2020"
    examples = (
        "runs/minilm-sst2 --limit 100 --data-dir ../shared/data",
        "--hf minilm --task sst2 --out results/minilm-rollout --data-dir ../shared/data",
    )
    needs_prediction = False  # the maps need attention only; importance is compared when there is a prediction

    @dataclass
    class Options:
        importance: list[str] = field(
            default_factory=lambda: list(DEFAULT_IMPORTANCE),
            metadata={
                "help": "Reference importance: explanations of the prediction (`attnaudit explanations`), e.g. gradient, "
                "loo, input_gradient (A&Z), ig (models with a trained head)."
            },
        )
        query: str = field(
            default="cls", metadata={"help": "Token scores from the cls row (mean of rows without [CLS]), mean or max over rows."}
        )
        flow_limit: int | None = field(
            default=100, metadata={"help": "Compute flow for the first N instances only (flow is expensive); 0 = none."}
        )
        residual: float = field(default=0.5, metadata={"help": "Weight of the identity in Â = r·I + (1-r)·A."})
        head_fusion: str = field(default="mean", metadata={"help": "Fuse heads by mean, max or min."})
        include_special: bool = field(
            default=True, metadata={"help": "Correlate over [CLS]/[SEP] too (Abnar & Zuidema did)."}
        )
        batch_size: int = field(default=16, metadata={"help": "Instances per batch."})

    def applies(self, run: Run) -> str | None:
        if not run.model.self_attention and run.model.cross_layers:
            return (
                "rollout and flow compose one stack of token-to-token self-attention; an encoder-decoder mixes "
                "encoder self-attention, causal decoder self-attention and cross-attention, which they do not compose"
            )
        if not run.model.self_attention:
            return (
                f"rollout and flow compose stacked self-attention layers; a {run.family} model has one attention "
                "over encoder states, not a stack of token-to-token attentions"
            )
        if run.task.task_type not in ("classification", "pair"):
            return (
                "the maps are read off the row that explains one prediction per instance; "
                f"a {run.task.task_type} model makes one per token"
            )
        return None

    @classmethod
    def explanation_choices(cls) -> list[str]:
        """The registered explanations of a prediction (those needing one): the references."""
        return [m.name for m in EXPLANATIONS.values() if "prediction" in m.needs]

    def _check(self, options: Any, model: AttentionModel) -> tuple[dict[str, Explanation], dict[str, str]]:
        """The reference importances compared (none without a trained head) and the default ones that do not apply
        to ``model`` (name -> why; one the user named that does not apply is a one-line error)."""
        known = self.explanation_choices()
        unknown = [name for name in options.importance if name not in known]
        if unknown or not options.importance:
            raise AttnAuditError(f"--importance must name some of {', '.join(known)}; got {options.importance}")
        if options.query not in ("cls", "mean", "max"):
            raise AttnAuditError(f"--query must be cls, mean or max, got {options.query!r}")
        if options.flow_limit is not None and options.flow_limit < 0:
            raise AttnAuditError(f"--flow-limit must be >= 0, got {options.flow_limit}")
        return applying(options.importance, model, "--importance", DEFAULT_IMPORTANCE) if model.trained_head else ({}, {})

    def _scores(
        self, trace: Any, options: Any, cls_index: int | Tensor | None, flow_rows: list[int]
    ) -> dict[str, np.ndarray]:
        """Token scores ``(B, L, T)`` per method for one batch; flow for the batch rows ``flow_rows`` only
        (the other rows of its array are zero)."""
        weights = trace.weights
        mask = trace[0].mask
        scores = {
            "raw": explanation_rows(torch.stack(weights, 1).mean(2), mask, options.query, cls_index),
            "rollout": explanation_rows(
                rollout(weights, options.head_fusion, options.residual, mask), mask, options.query, cls_index
            ),
        }
        if flow_rows:
            pick = torch.tensor(flow_rows, device=mask.device)
            values = flow([w[pick] for w in weights], options.head_fusion, options.residual, mask[pick])
            # A&Z normalise each flow row to sum 1; of the statistics, it matters for --query max only.
            values = values / values.sum(-1, keepdim=True).clamp_min(torch.finfo(values.dtype).tiny)
            rows = cls_index[pick] if isinstance(cls_index, Tensor) else cls_index
            picked = explanation_rows(values, mask[pick], options.query, rows).to(scores["raw"].dtype)
            scores["flow"] = torch.zeros_like(scores["raw"]).index_copy(0, pick, picked)
        return {method: values.float().cpu().numpy() for method, values in scores.items()}

    shardable = True

    def part(self, run: Run, examples: list[Example], options: Any, seed: int = 0, indices: Sequence[int] | None = None) -> Result:
        references, _ = self._check(options, run.model)
        model = run.model
        special = set(model.special_tokens.values())
        instances: list[dict[str, Any]] = []
        maps: list[dict[str, Any]] = []
        excluded = 0
        model.eval()
        tested = where(examples, indices)
        batches = run.sorted_batches(examples, options.batch_size)
        for positions, batch in track(batches, "rollout", math.ceil(len(examples) / options.batch_size)):
            at = [tested[i] for i in positions]
            out = base_pass(model, batch)
            flow_rows = [i for i, index in enumerate(at) if options.flow_limit is None or index < options.flow_limit]
            scores = self._scores(out.trace, options, model.explanation_rows(out.trace[0].mask), flow_rows)
            imp = {name: fn(model, batch, seed=seed).detach().float().cpu().numpy() for name, fn in references.items()}
            items = item_mask(model, batch).cpu().numpy()
            width = items.shape[1]
            tokens = key_tokens(run, batch)
            predicted = out.logits.argmax(-1).tolist() if model.trained_head else None
            for i in range(len(batch)):
                is_special = np.array([t in special for t in tokens[i][:width]], dtype=bool) if special else None
                keep = items[i] & ~is_special if is_special is not None and not options.include_special else items[i]
                row: dict[str, Any] = {"index": at[i], "n_items": int(keep.sum())}
                if predicted is not None:
                    row["predicted"] = run.labels[predicted[i]] if predicted[i] < len(run.labels) else predicted[i]
                excluded += row["n_items"] < 3
                words = [t for t, real in zip(tokens[i], items[i]) if real]
                for method, values in scores.items():
                    if method == "flow" and i not in flow_rows:  # past --flow-limit
                        continue
                    matrix = values[i, :, :width]
                    maps += [
                        {"index": at[i], "layer": layer, "method": method, "items": words,
                         "scores": vector[items[i]].tolist()}
                        for layer, vector in enumerate(matrix)
                    ]
                    raw = None if method == "raw" else scores["raw"][i, :, :width]
                    columns = map_statistics(matrix, raw, keep, items[i], is_special)
                    for name, reference in imp.items():
                        ref = reference[i, :width][keep]
                        finite = np.isfinite(ref).all()
                        columns[name] = spearman_rows(matrix[:, keep], ref) if finite else np.full(len(matrix), np.nan)
                    for stat, per_layer in columns.items():
                        row.update({f"L{layer}_{method}_{stat}": float(v) for layer, v in enumerate(per_layer)})
                instances.append(row)
        instances.sort(key=lambda row: row["index"])
        maps.sort(key=lambda row: row["index"])  # stable: layers and methods keep their order
        return Result(test=self.name, instances=instances, tables={"maps": maps}, meta={"excluded": excluded})

    def merge(self, run: Run, parts: list[Result], options: Any, seed: int = 0) -> Result:
        model = run.model
        instances = joined(parts)
        references, dropped = self._check(options, model)
        flow_limit = len(instances) if options.flow_limit is None else min(options.flow_limit, len(instances))
        statistics = [s for s in MAP_STATISTICS if s != "special_share" or model.special_tokens]
        return self._result(
            instances, joined(parts, "maps"), model.num_attention_layers, list(references), statistics, flow_limit,
            counted(parts, "excluded"), options, dropped,
            "the last real token's row (a decoder's explaining query; causal: it reads itself and earlier tokens only)"
            if model.causal else "the [CLS] row" if model.explanation_query is not None else "",
        )

    def _result(
        self,
        instances: list[dict[str, Any]],
        maps: list[dict[str, Any]],
        n_layers: int,
        references: list[str],
        statistics: list[str],
        flow_limit: int,
        excluded: int,
        options: Any,
        dropped: dict[str, str],
        explained_by: str,
    ) -> Result:
        last = n_layers - 1
        summary: dict[str, Any] = {"instances": len(instances), "flow_instances": flow_limit}
        correlations = layer_table(instances, n_layers, references, "importance")
        summary.update({f"{r['method']}_vs_{r['importance']}": r["mean"] for r in correlations if r["layer"] == last})
        summaries = layer_table(instances, n_layers, statistics, "statistic")
        summary.update({f"{r['method']}_{r['statistic']}": r["mean"] for r in summaries if r["layer"] == last})
        rows_from = (
            "the max over query rows" if options.query == "max"
            else "the mean over real query rows" if options.query == "mean" or not explained_by
            else explained_by
        )
        notes = [
            f"token scores are read from {rows_from} of each layer's matrix; layers are 0-based (A&Z's L1 = layer 0)",
            "table maps: each instance's token scores per layer and method over its real tokens (flow rows normalised "
            "to sum 1, as A&Z); table map_layers: per layer, the normalised entropy of the scores (1 = even over the "
            "tokens, 0 = all on one)"
            + (", their share on [CLS]/[SEP]" if "special_share" in statistics else "")
            + " and their Spearman ρ with raw attention of the same layer",
            "Spearman ρ and entropy per instance over its tokens"
            + ("" if options.include_special else " (without [CLS]/[SEP])")
            + "; the tables give mean/std over instances; instances with fewer than 3 tokens give NaN ρ "
            f"({excluded} here)",
            f"flow computed for the first {flow_limit} instances (--flow-limit); raw and rollout for all {len(instances)}",
            "gradient = J&W |Σ_d ∂ŷ/∂e·e| with attention detached; loo = output change when a token is removed "
            "(A&Z's blank-out replaced a token with UNK instead); input_gradient = |Σ_d ∂z_ŷ/∂e| with attention live "
            "(meta.published holds A&Z's figures against their input gradients)"
            if references
            else NO_PREDICTION,
            *(f"{name} not compared: it does not apply to this model: {reason}" for name, reason in dropped.items()),
        ]
        tables = {"layers": correlations} if references else {}
        tables.update({"map_layers": summaries, "maps": maps})
        meta: dict[str, Any] = {"notes": notes, "query": options.query, "importance": references}
        if references:
            meta["published"] = PUBLISHED
        return Result(test=self.name, summary=summary, instances=instances, tables=tables, meta=meta)

    def verdict(self, result: Result) -> list[dict[str, Any]]:
        """Last-layer correlation of raw attention, rollout and flow with importance (Abnar & Zuidema 2020,
        Table 3) when the model predicts; how composing the layers changes the maps in any case."""
        rows = self._importance_verdict(result.summary)
        rows += self._map_verdict(result.summary, compared=bool(rows))
        return rows or super().verdict(result)

    def _importance_verdict(self, s: dict[str, Any]) -> list[dict[str, Any]]:
        rows = []
        for reference in ("input_gradient", "gradient", "loo", "ig"):
            raw = s.get(f"raw_vs_{reference}")
            if not _finite(raw):
                continue
            for method in ("rollout", "flow"):
                value = s.get(f"{method}_vs_{reference}")
                if not _finite(value):
                    continue
                change = value - raw
                meaning = (
                    f"last layer, Spearman ρ with {reference}: {method} {value:.2f} vs raw attention {raw:.2f}: "
                    + (
                        f"composing the layers brings attention closer to importance (+{change:.2f})"
                        if change > 0.05
                        else f"composing the layers makes it agree less ({change:+.2f})"
                        if change < -0.05
                        else "composing the layers changes little"
                    )
                )
                rows.append(
                    {
                        "statistic": f"{method}_vs_{reference}",
                        "value": value,
                        "published": "L6: raw 0.09, rollout 0.13, flow 0.14 (A&Z 2020, DistilBERT SST-2, input gradients)"
                        if reference == "input_gradient"
                        else "",
                        "interpretation": meaning,
                    }
                )
        return rows

    def _map_verdict(self, s: dict[str, Any], compared: bool) -> list[dict[str, Any]]:
        rows = []
        for method in ("rollout", "flow"):
            rho = s.get(f"{method}_vs_raw")
            if not _finite(rho):
                continue
            meaning = f"last layer, Spearman ρ of {method} with raw attention {rho:.2f}: composing the layers " + (
                "keeps raw attention's ranking of the tokens"
                if rho >= 0.7
                else "reorders the tokens: the last layer's raw attention and the composed map tell different stories"
                if rho < 0.3
                else "partly reorders the tokens"
            )
            spread, raw_spread = s.get(f"{method}_entropy"), s.get("raw_entropy")
            if _finite(spread) and _finite(raw_spread):
                meaning += f"; normalised entropy {spread:.2f} vs raw {raw_spread:.2f} (1 = even): " + (
                    "it spreads the weight over the tokens"
                    if spread - raw_spread > 0.05
                    else "it concentrates the weight"
                    if spread - raw_spread < -0.05
                    else "a similar spread"
                )
            if not compared:
                meaning += (
                    " (no trained head: no prediction to compare with importance, so this describes the maps, not faithfulness)"
                )
            rows.append({"statistic": f"{method}_vs_raw", "value": rho, "published": "", "interpretation": meaning})
        return rows

    def plot(self, result: Result, directory: Path) -> list[Path]:
        paths = _layer_plot(
            result.tables.get("layers", []), "importance", lambda name: f"vs {name}", "mean Spearman ρ (± s.e.)",
            "Attention-based token importance per layer (Abnar & Zuidema 2020)", directory, "rollout_correlation",
        )
        return paths + _layer_plot(
            result.tables.get("map_layers", []), "statistic", lambda name: MAP_STATISTICS.get(name, name),
            "mean over instances (± s.e.)", "Raw attention, rollout and flow maps per layer", directory, "rollout_maps",
        )


def _layer_plot(
    table: list[dict[str, Any]],
    column: str,
    title: Callable[[str], str],
    ylabel: str,
    suptitle: str,
    directory: Path,
    stem: str,
) -> list[Path]:
    """One panel per value of ``column`` in a per-layer ``table``: the mean per layer and method, ± s.e."""
    from attnaudit.plotting import pyplot

    plt = pyplot()
    names = list(dict.fromkeys(r[column] for r in table))
    if not names:
        return []
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.4), squeeze=False)
    for ax, name in zip(axes[0], names):
        for number, (method, marker) in enumerate(zip(METHODS, ("o", "s", "^"))):
            rows = [r for r in table if r[column] == name and r["method"] == method and r["n"] > 0]
            if not rows:
                continue
            se = [r["std"] / math.sqrt(r["n"]) for r in rows]
            layers, means = [r["layer"] + 1 for r in rows], [r["mean"] for r in rows]
            ax.errorbar(layers, means, yerr=se, marker=marker, color=f"C{number}", capsize=3, label=method)
        ax.set_xticks(sorted({r["layer"] + 1 for r in table}))
        ax.axhline(0.0, color="grey", linewidth=0.6)
        ax.set_title(title(name))
        ax.set_xlabel("layer (1-based, as in A&Z)")
    axes[0][0].set_ylabel(ylabel)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(suptitle, y=1.03)
    return save_figure(fig, directory, stem)
