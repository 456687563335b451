"""Raw attention vs attention rollout vs attention flow as token importance (Abnar & Zuidema 2020).

Per layer ``l`` each method gives one score per input token: raw attention of layer ``l``
(heads averaged), rollout ``R_l = Â_l ⋯ Â_1`` and max-flow through ``Â`` (both with the
residual adjustment ``Â = ½I + ½A``, :mod:`attnaudit.flow`); the score vector is read off
the explanation row (``[CLS]`` for Hugging Face models; the mean over real queries for our
mean-pooled Transformer), or, with ``--query max``, the maximum over query rows as in
Abnar & Zuidema's DistilBERT script. Each is rank-correlated (Spearman, per instance)
with reference importance scores for the predicted class:

* ``gradient``: J&W's ``|Σ_d ∂ŷ/∂e·e|`` with attention detached (:mod:`attnaudit.importance`);
* ``loo``: leave-one-out output change when a token is removed (:mod:`attnaudit.importance`);
* ``input_gradient``: ``|Σ_d ∂z/∂e|``, the gradient of the predicted logit with attention
  left live — the "input gradients" of Abnar & Zuidema's released code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnaudit.data.types import Batch, Example
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.base import Experiment, Result, register, save_figure, summarise
from attnaudit.experiments.common import spearman_rho
from attnaudit.flow import flow, rollout
from attnaudit.models.base import evaluation
from attnaudit.progress import track
from attnaudit.run import Run

METHODS = ("raw", "rollout", "flow")

# Abnar & Zuidema (2020), Table 3: Spearman ρ (mean ± std over 100 SST-2 test sentences) between
# attention-based importance and input gradients, DistilBERT fine-tuned on SST-2. Their L1..L6
# are our 0-based layers 0..5; L2 and L4 were not reported.
PUBLISHED = {
    "paper": "Abnar & Zuidema 2020, Quantifying Attention Flow in Transformers (ACL), Table 3",
    "setting": "DistilBERT fine-tuned on SST-2, 100 test sentences; importance = input gradients "
    "(|Σ_d ∂ logit / ∂ e| of one class, attention not detached: our `input_gradient`); token score = "
    "max over query rows in their released script (our --query max); all wordpieces incl. [CLS]/[SEP]",
    "input_gradient": {
        "L1": {"raw": [0.12, 0.21], "rollout": [0.11, 0.19], "flow": [0.11, 0.19]},
        "L3": {"raw": [0.09, 0.21], "rollout": [0.12, 0.21], "flow": [0.11, 0.21]},
        "L5": {"raw": [0.08, 0.20], "rollout": [0.13, 0.21], "flow": [0.12, 0.22]},
        "L6": {"raw": [0.09, 0.21], "rollout": [0.13, 0.20], "flow": [0.14, 0.21]},
    },
    "verb_number_6layer_blank_out_L6": {"raw": 0.29, "rollout": 0.71, "flow": 0.70},
    "verb_number_6layer_input_gradients_L6": {"raw": 0.46, "rollout": 0.54, "flow": 0.61},
}


def input_gradient(run: Run, batch: Batch) -> Tensor:
    """Abnar & Zuidema's input gradient ``|Σ_d ∂z_ŷ/∂e_{t,d}|`` (predicted logit, attention live), ``(B, K)``."""
    from attnaudit.importance import item_mask

    model = run.model
    with evaluation(model), torch.enable_grad():
        embeddings = model.embed(batch).detach().requires_grad_(True)
        logits = model(batch, embeddings=embeddings).logits
        chosen = logits.gather(1, logits.argmax(-1, keepdim=True)).sum()
        (grad,) = torch.autograd.grad(chosen, embeddings)
    mask = item_mask(run, batch)
    return grad.sum(-1)[:, : mask.shape[1]].abs() * mask.to(grad.dtype)


def explanation_rows(matrices: Tensor, mask: Tensor, query: str, cls_index: int | None) -> Tensor:
    """``(B, L, T, T)`` -> ``(B, L, T)``: the row(s) of each layer's matrix that explain the prediction.

    ``query``: ``cls`` (row ``cls_index``; without one, the mean over real queries), ``mean`` or
    ``max`` over real query rows. Padded keys come out 0.
    """
    keys = mask[:, None, :].to(matrices.dtype)
    if query == "cls" and cls_index is not None:
        return matrices[:, :, cls_index, :] * keys
    rows = mask[:, None, :, None]
    if query == "max":
        return matrices.masked_fill(~rows, float("-inf")).amax(2).clamp_min(0.0) * keys
    m = rows.to(matrices.dtype)
    return (matrices * m).sum(2) / m.sum(2).clamp_min(1.0) * keys


@register
class Rollout(Experiment):
    """The test of this module (its docstring gives the method, options and outputs)."""

    name = "rollout"
    description = "raw attention, rollout and flow per layer vs gradient / leave-one-out importance (Abnar & Zuidema)"
    paper = "Abnar & Zuidema 2020"
    examples = ("runs/minilm-sst2 --limit 100 --data-dir ../shared/data", "--hf minilm --task sst2 --out results/minilm-rollout --data-dir ../shared/data")

    @dataclass
    class Options:
        importance: list[str] = field(
            default_factory=lambda: ["gradient", "loo", "input_gradient"],
            metadata={"help": "Reference importance: gradient, loo, input_gradient (A&Z), ig, ..."},
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
        if run.family not in ("transformer", "hf"):
            return (
                f"rollout and flow compose stacked self-attention layers; a {run.family} model has one attention "
                "over encoder states, not a stack of token-to-token attentions"
            )
        if run.task.task_type not in ("classification", "pair"):
            return f"the importance references explain one prediction per instance; a {run.task.task_type} model makes one per token"
        return None

    def _check(self, options: Any) -> dict[str, Any]:
        from attnaudit.importance import IMPORTANCE

        known = {**{k: v for k, v in IMPORTANCE.items() if k != "attention"}, "input_gradient": input_gradient}
        unknown = [name for name in options.importance if name not in known]
        if unknown or not options.importance:
            raise AttnAuditError(f"--importance must name some of {', '.join(known)}; got {options.importance}")
        if options.query not in ("cls", "mean", "max"):
            raise AttnAuditError(f"--query must be cls, mean or max, got {options.query!r}")
        if options.flow_limit is not None and options.flow_limit < 0:
            raise AttnAuditError(f"--flow-limit must be >= 0, got {options.flow_limit}")
        return {name: known[name] for name in options.importance}

    def run(self, run: Run, examples: list[Example], options: Any, seed: int = 0) -> Result:
        from attnaudit.experiments.norms import key_tokens
        from attnaudit.importance import item_mask

        references = self._check(options)
        model = run.model
        cls_index = model.explanation_query
        special = set(model.special_tokens.values())
        flow_limit = len(examples) if options.flow_limit is None else min(options.flow_limit, len(examples))
        n_layers = model.num_attention_layers
        instances: list[dict[str, Any]] = []
        done, excluded = 0, 0
        model.eval()
        for batch in track(run.batches(examples, options.batch_size), "rollout", math.ceil(len(examples) / options.batch_size)):
            with torch.no_grad():
                out = model(batch)
            weights = out.trace.weights
            mask = out.trace[0].mask
            scores = {
                "raw": explanation_rows(torch.stack(weights, 1).mean(2), mask, options.query, cls_index),
                "rollout": explanation_rows(
                    rollout(weights, options.head_fusion, options.residual, mask), mask, options.query, cls_index
                ),
            }
            with_flow = max(0, min(len(batch), flow_limit - done))
            if with_flow:
                sub = [w[:with_flow] for w in weights]
                values = flow(sub, options.head_fusion, options.residual, mask[:with_flow])
                # A&Z normalise each flow row to sum 1; it matters for --query max only.
                values = values / values.sum(-1, keepdim=True).clamp_min(torch.finfo(values.dtype).tiny)
                scores["flow"] = explanation_rows(values, mask[:with_flow], options.query, cls_index)
            items = item_mask(run, batch)
            imp = {name: fn(run, batch).detach() for name, fn in references.items()}
            predicted = out.logits.argmax(-1).tolist()
            tokens = key_tokens(run, batch) if not options.include_special and special else None
            for i in range(len(batch)):
                keep = items[i].clone()
                if tokens is not None:
                    keep &= torch.tensor([t not in special for t in tokens[i][: keep.shape[0]]], device=keep.device)
                row: dict[str, Any] = {
                    "index": done + i,
                    "n_items": int(keep.sum()),
                    "predicted": run.labels[predicted[i]] if predicted[i] < len(run.labels) else predicted[i],
                }
                if row["n_items"] < 3:
                    excluded += 1
                for method in METHODS:
                    if method not in scores or (method == "flow" and i >= with_flow):
                        continue
                    for layer in range(n_layers):
                        attention = scores[method][i, layer, : keep.shape[0]][keep].float().cpu().numpy()
                        for name, values in imp.items():
                            reference = values[i, : keep.shape[0]][keep].float().cpu().numpy()
                            ok = np.isfinite(reference).all()
                            row[f"L{layer}_{method}_{name}"] = spearman_rho(attention, reference) if ok else float("nan")
                instances.append(row)
            done += len(batch)
        return self._result(instances, n_layers, list(references), flow_limit, excluded, options, cls_index)

    def _result(
        self,
        instances: list[dict[str, Any]],
        n_layers: int,
        references: list[str],
        flow_limit: int,
        excluded: int,
        options: Any,
        cls_index: int | None,
    ) -> Result:
        table = []
        for layer in range(n_layers):
            for method in METHODS:
                for name in references:
                    key = f"L{layer}_{method}_{name}"
                    stats = summarise([row[key] for row in instances if key in row])
                    table.append(
                        {"layer": layer, "paper_layer": f"L{layer + 1}", "method": method, "importance": name, **stats}
                    )
        last = n_layers - 1
        summary: dict[str, Any] = {"instances": len(instances), "flow_instances": flow_limit}
        for row in table:
            if row["layer"] == last:
                summary[f"{row['method']}_vs_{row['importance']}"] = row["mean"]
        rows_from = "the [CLS] row" if options.query == "cls" and cls_index is not None else (
            "the max over query rows" if options.query == "max" else "the mean over real query rows"
        )
        notes = [
            f"token scores are read from {rows_from} of each layer's matrix; layers are 0-based (A&Z's L1 = layer 0)",
            "Spearman ρ per instance over its tokens"
            + ("" if options.include_special else " (without [CLS]/[SEP])")
            + "; the table gives mean/std over instances; instances with fewer than 3 tokens give NaN "
            f"({excluded} here)",
            f"flow computed for the first {flow_limit} instances (--flow-limit); raw and rollout for all {len(instances)}",
            "gradient = J&W |Σ_d ∂ŷ/∂e·e| with attention detached; loo = output change when a token is removed "
            "(A&Z's blank-out replaced a token with UNK instead); input_gradient = |Σ_d ∂z_ŷ/∂e| with attention live "
            "(A&Z's code used one class's logit the same way) — compare input_gradient with meta.published",
        ]
        return Result(
            test=self.name,
            summary=summary,
            instances=instances,
            tables={"layers": table},
            meta={"notes": notes, "published": PUBLISHED, "query": options.query},
        )

    def verdict(self, result: Result) -> list[dict[str, Any]]:
        """Last-layer correlation of raw attention, rollout and flow with importance (Abnar & Zuidema 2020, Table 3)."""
        s = result.summary
        rows = []
        for reference in ("input_gradient", "gradient", "loo", "ig"):
            raw = s.get(f"raw_vs_{reference}")
            if not isinstance(raw, (int, float)) or not math.isfinite(raw):
                continue
            for method in ("rollout", "flow"):
                value = s.get(f"{method}_vs_{reference}")
                if not isinstance(value, (int, float)) or not math.isfinite(value):
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
        return rows or super().verdict(result)

    def plot(self, result: Result, directory: Path) -> list[Path]:
        from attnaudit.plotting import pyplot

        plt = pyplot()

        table = result.tables.get("layers", [])
        references = list(dict.fromkeys(r["importance"] for r in table))
        if not references:
            return []
        fig, axes = plt.subplots(1, len(references), figsize=(4.2 * len(references), 3.4), sharey=True, squeeze=False)
        for ax, name in zip(axes[0], references):
            for method, marker in zip(METHODS, ("o", "s", "^")):
                rows = [r for r in table if r["importance"] == name and r["method"] == method and r["n"] > 0]
                if not rows:
                    continue
                layers = [r["layer"] + 1 for r in rows]
                se = [r["std"] / math.sqrt(r["n"]) for r in rows]
                ax.errorbar(layers, [r["mean"] for r in rows], yerr=se, marker=marker, capsize=3, label=method)
            ax.set_xticks(sorted({r["layer"] + 1 for r in table}))
            ax.axhline(0.0, color="grey", linewidth=0.6)
            ax.set_title(f"vs {name}")
            ax.set_xlabel("layer (1-based, as in A&Z)")
        axes[0][0].set_ylabel("mean Spearman ρ (± s.e.)")
        axes[0][-1].legend(fontsize=8)
        fig.suptitle("Attention-based token importance per layer (Abnar & Zuidema 2020)", y=1.03)
        return save_figure(fig, directory, "rollout_correlation")
