"""Does attention rank the inputs like post-hoc importance does? (Jain & Wallace 2019, §4.1)

Per instance, Kendall's τ-b over the real items (tokens; passage tokens for pair/QA;
sentences for HAN) between the explained attention and each importance method (gradient,
leave-one-out, optionally Integrated Gradients or the attention-gradient methods), plus
gradient vs leave-one-out as the reference row: two post-hoc methods that should agree
with each other more than either agrees with attention if attention is not an explanation.
Transformers get the same τ for every layer and head. Jain & Wallace report weak
attention/importance correlations on SST next to a strong gradient/LOO one.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnaudit.algorithms.metrics import kendall_tau, kendall_tau_rows, kendall_tau_topk
from attnaudit.data.types import Example
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.common.passes import base_pass
from attnaudit.experiments.experiment import AuditSettings, Experiment, Result, counted, joined, register, summarise, where
from attnaudit.explain import EXPLANATIONS, choose, item_mask
from attnaudit.explain.helpers.attention import attention_per_head, explained_attention
from attnaudit.explain.registry import hierarchical
from attnaudit.models.interface import evaluation
from attnaudit.plotting import save_figure
from attnaudit.progress import track
from attnaudit.run import Run

SIGNIFICANCE = 0.05
REFERENCE = ("gradient", "loo")
PUBLISHED: dict[str, Any] = {
    "source": "Jain & Wallace (NAACL 2019), SST, BiLSTM encoder with additive (tanh) attention",
    "attention_vs_gradient": {"mean": 0.351, "std": 0.211, "significant": 0.49},
    "attention_vs_loo": {"mean": 0.291, "std": 0.191},
    "gradient_vs_loo": {"mean": 0.656},
}


def pair_name(a: str, b: str) -> str:
    """Column stem of a compared pair, e.g. ``attention_vs_gradient``."""
    return f"{a}_vs_{b}"


def _significant(pvalues: list[float]) -> float:
    """Fraction of finite p-values at or below :data:`SIGNIFICANCE` (NaN when there are none)."""
    finite = [p for p in pvalues if np.isfinite(p)]
    return float(np.mean([p <= SIGNIFICANCE for p in finite])) if finite else float("nan")


@register
class ImportanceCorrelation(Experiment):
    """Jain & Wallace's attention-vs-importance rank correlation test."""

    name = "importance"
    settings = AuditSettings(
        rank=3,
        decoder_options={"batch_size": 8},
        demo={"full": {"methods": ["gradient", "loo", "ig"], "ig_steps": 20}, "quick": {"methods": ["gradient"]}},
        ranks_instances="tau_attention_vs_gradient",
        instance_effects={"tau_attention_vs_gradient": ("Kendall τ of attention and gradient (lowest: most disagreement)", "asc")},
    )
    description = "Kendall τ between attention and gradient / leave-one-out / IG importance, per instance"
    paper = "Jain & Wallace 2019"

    @dataclass
    class Options:
        methods: list[str] = field(
            default_factory=lambda: ["gradient", "loo"],
            metadata={
                "help": "Explanations to compare with attention (`attnaudit explanations` lists them). "
                "gradient and loo together add the gradient-vs-LOO reference row."
            },
        )
        topk: int = field(default=5, metadata={"help": "k of the top-k τ variant (union of both methods' top k)."})
        ig_steps: int = field(default=50, metadata={"help": "Integration steps for ig."})
        loo_tokens: int | None = field(
            default=None,
            metadata={"help": "Approximate loo (opt-in): remove only each instance's K items of highest gradient importance; "
                      "the others score 0. Default: every item (exact)."},
        )
        batch_size: int = field(default=32, metadata={"help": "Instances per batch."})

    def applies(self, run: Run) -> str | None:
        if run.task.task_type not in ("classification", "pair"):
            return (
                f"a {run.task.task_type} model makes one decision per token, and the importance test ranks the "
                "inputs behind one decision per instance (classification, pair/QA)"
            )
        return None

    @classmethod
    def explanation_choices(cls) -> list[str]:
        """Every registered explanation but ``attention``, which each is compared with."""
        return [name for name in EXPLANATIONS if name != "attention"]

    shardable = True

    def _pairs(self, run: Run, options: Any) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """The chosen methods and the (attention, method) pairs compared, with the gradient-vs-LOO reference."""
        chosen = choose(options.methods, self.explanation_choices(), model=run.model)
        if options.topk < 1:
            raise AttnAuditError(f"--topk must be at least 1, got {options.topk}")
        if options.batch_size < 1:
            raise AttnAuditError(f"--batch-size must be at least 1, got {options.batch_size}")
        pairs = [("attention", m) for m in chosen]
        if all(m in chosen for m in REFERENCE):
            pairs.append(REFERENCE)
        return chosen, pairs

    def part(self, run: Run, examples: list[Example], options: Any, seed: int = 0, indices: Sequence[int] | None = None) -> Result:
        """Instance rows, and in table ``head_taus`` every head's τ per instance in the order the batches ran
        (merged in shard order, the per-head lists are one process's, so their summaries are too)."""
        chosen, pairs = self._pairs(run, options)
        methods = list(chosen)
        instances: list[dict[str, Any]] = []
        heads: dict[tuple[int, int | str, str], list[float]] = defaultdict(list)
        head_p: dict[tuple[int, int | str, str], list[float]] = defaultdict(list)
        excluded = 0
        decisions: list[tuple[str | None, str]] = []  # (gold, predicted) of every instance, for the accuracy
        layers_heads = (0, 0)
        total = -(-len(examples) // options.batch_size)
        tested = where(examples, indices)
        with evaluation(run.model):
            for positions, batch in track(run.sorted_batches(examples, options.batch_size), "importance", total=total):
                mask = item_mask(run.model, batch)
                output = base_pass(run.model, batch)  # one pass gives the attention, every head's and the decision
                scores = {"attention": explained_attention(run.model, batch, output.trace)}
                for method in methods:
                    scores[method] = chosen[method](run.model, batch, steps=options.ig_steps, seed=seed, loo_tokens=options.loo_tokens)
                pred = output.logits.argmax(-1).tolist()
                decisions += [(example.label, run.labels[p]) for example, p in zip(batch.examples, pred)]
                per_head = attention_per_head(run.model, batch, output.trace)
                del output
                layers_heads = (int(per_head.shape[1]), int(per_head.shape[2]))
                many = per_head.shape[1] * per_head.shape[2] > 1
                values = {k: v.detach().cpu().double() for k, v in scores.items()}
                per_head = per_head.detach().cpu().double()
                for b, (index, example) in enumerate(zip([tested[i] for i in positions], batch.examples)):
                    real = mask[b].cpu()
                    n = int(real.sum())
                    if n < 2:
                        excluded += 1
                        continue
                    vec = {k: v[b][real].numpy() for k, v in values.items()}
                    row = self._instance_row(index, example, n, run.labels[pred[b]], vec, pairs, options.topk)
                    instances.append(row)
                    if many:
                        self._per_head(per_head[b][:, :, real].numpy(), vec, methods, heads, head_p)
        instances.sort(key=lambda row: row["index"])
        head_taus = [
            {"layer": layer, "head": head, "method": method, "tau": tau, "p": p}
            for (layer, head, method), taus in heads.items()
            for tau, p in zip(taus, head_p[(layer, head, method)])
        ]
        meta = {"excluded": excluded, "decisions": decisions, "layers_heads": list(layers_heads)}
        return Result(test=self.name, instances=instances, tables={"head_taus": head_taus}, meta=meta)

    def merge(self, run: Run, parts: list[Result], options: Any, seed: int = 0) -> Result:
        chosen, pairs = self._pairs(run, options)
        heads: dict[tuple[int, int | str, str], list[float]] = defaultdict(list)
        head_p: dict[tuple[int, int | str, str], list[float]] = defaultdict(list)
        for part in parts:  # in shard order: each head's list in the order one process appends to it
            for row in part.tables.get("head_taus", []):
                key = (int(row["layer"]), row["head"], row["method"])
                heads[key].append(row["tau"])
                head_p[key].append(row["p"])
        layers_heads = max((tuple(part.meta["layers_heads"]) for part in parts), default=(0, 0))
        decisions = [(gold, pred) for part in parts for gold, pred in part.meta["decisions"]]
        result = self._result(run, joined(parts), pairs, list(chosen), heads, head_p, layers_heads, counted(parts, "excluded"), options)
        result.summary.update(accuracy(decisions))
        return result

    @staticmethod
    def _instance_row(
        index: int,
        example: Example,
        length: int,
        pred: str,
        vec: dict[str, np.ndarray],
        pairs: list[tuple[str, str]],
        topk: int,
    ) -> dict[str, Any]:
        """τ, p-value and top-k τ of every pair for one instance (``vec``: scores over its real items)."""
        row: dict[str, Any] = {
            "index": index,
            "source": example.meta.get("source", ""),
            "length": length,
            "label": example.label,
            "pred": pred,
        }
        for a, m in pairs:
            name = pair_name(a, m)
            row[f"tau_{name}"], row[f"p_{name}"] = kendall_tau(vec[a], vec[m])
            row[f"tau_topk_{name}"] = kendall_tau_topk(vec[a], vec[m], topk)[0]
        return row

    @staticmethod
    def _per_head(
        attention: np.ndarray,
        vec: dict[str, np.ndarray],
        methods: list[str],
        heads: dict[tuple[int, int | str, str], list[float]],
        head_p: dict[tuple[int, int | str, str], list[float]],
    ) -> None:
        """τ of every head (and the head mean) of every layer against each method, for one instance."""
        n_layers, n_heads = attention.shape[:2]
        rows = np.concatenate([attention, attention.mean(1, keepdims=True)], 1).reshape(n_layers * (n_heads + 1), -1)
        names: list[int | str] = [*range(n_heads), "mean"]
        for method in methods:
            taus, pvalues = kendall_tau_rows(rows, vec[method])
            for row, (tau, p) in enumerate(zip(taus.tolist(), pvalues.tolist())):
                key = (row // (n_heads + 1), names[row % (n_heads + 1)], method)
                heads[key].append(tau)
                head_p[key].append(p)

    @staticmethod
    def _result(
        run: Run,
        instances: list[dict[str, Any]],
        pairs: list[tuple[str, str]],
        methods: list[str],
        heads: dict[tuple[int, int | str, str], list[float]],
        head_p: dict[tuple[int, int | str, str], list[float]],
        layers_heads: tuple[int, int],
        excluded: int,
        options: Any,
    ) -> Result:
        summary: dict[str, Any] = {"n": len(instances), "excluded_short": excluded}
        pair_rows, class_rows = [], []
        for a, m in pairs:
            stats, row, by_class = _pair(instances, pair_name(a, m))
            summary.update(stats)
            pair_rows.append(row)
            class_rows += by_class
        tables: dict[str, list[dict[str, Any]]] = {"pairs": pair_rows, "by_predicted_class": class_rows}
        if heads:
            tables["heads"] = [
                {
                    "layer": layer,
                    "head": head,
                    "method": method,
                    **summarise(taus),
                    "significant": _significant(head_p[(layer, head, method)]),
                }
                for (layer, head, method), taus in heads.items()
            ]
            for method in methods:
                for layer in range(layers_heads[0]):
                    summary[f"tau_layer{layer}_headmean_vs_{method}_mean"] = summarise(heads[(layer, "mean", method)])[
                        "mean"
                    ]
        notes = _notes(run, options, methods, pairs, excluded, bool(heads))
        return Result(
            test="importance",
            summary=summary,
            instances=instances,
            tables=tables,
            meta={"notes": notes, "published": PUBLISHED, "topk": options.topk, "layers_heads": list(layers_heads)},
        )

    def verdict(self, result: Result) -> list[dict[str, Any]]:
        """Mean Kendall τ of each pair, read as agreement strength, beside Jain & Wallace's SST figures."""
        s = result.summary
        published = result.meta.get("published") or {}

        def strength(tau: float) -> str:
            size = abs(tau)
            word = "little" if size < 0.2 else "weak" if size < 0.4 else "moderate" if size < 0.6 else "strong"
            return f"{word} {'agreement' if tau >= 0 else 'disagreement'}"

        reference = s.get("tau_gradient_vs_loo_mean")
        reference = reference if isinstance(reference, (int, float)) and np.isfinite(reference) else None
        rows = []
        for key, value in s.items():
            if not (key.startswith("tau_") and key.endswith("_mean") and "_vs_" in key) or key.startswith(("tau_topk", "tau_layer")):
                continue
            if not isinstance(value, (int, float)) or not np.isfinite(value):
                continue
            pair = key[len("tau_") : -len("_mean")]
            a, b = pair.split("_vs_", 1)
            paper = published.get(pair, {}) if isinstance(published, dict) else {}
            significant = s.get(f"tau_{pair}_significant")
            text = f"mean τ({a}, {b}) = {value:.2f}: {strength(value)}"
            if isinstance(significant, (int, float)) and np.isfinite(significant):
                text += f"; significant (p ≤ 0.05) for {significant:.0%} of instances"
            if a == "attention" and reference is not None and reference > value + 0.1:
                text += f"; gradient and LOO agree more with each other (τ = {reference:.2f}) than {b} does with attention"
            if isinstance(paper, dict) and "mean" in paper:
                text += f"; J&W report {paper['mean']:.3f}"
            rows.append(
                {
                    "statistic": key,
                    "value": value,
                    "published": f"{paper['mean']} (J&W 2019, SST BiLSTM)" if isinstance(paper, dict) and "mean" in paper else "",
                    "interpretation": text,
                }
            )
        acc, majority = s.get("accuracy"), s.get("majority_class")
        if isinstance(acc, (int, float)) and isinstance(majority, (int, float)):
            rows.insert(0, {
                "statistic": "accuracy",
                "value": acc,
                "published": "",
                "interpretation": f"the explained predictions are right for {acc:.1%} of the instances; always predicting "
                f"the most frequent label would be right for {majority:.1%}",
            })
        return rows or super().verdict(result)

    def plot(self, result: Result, directory: Path) -> list[Path]:
        from attnaudit.plotting import pyplot

        plt = pyplot()

        paths: list[Path] = []
        pairs = [row["pair"] for row in result.tables.get("pairs", [])]
        if result.instances and pairs:
            classes = sorted({str(r["pred"]) for r in result.instances})
            fig, axes = plt.subplots(1, len(pairs), figsize=(4.2 * len(pairs), 3.4), squeeze=False)
            bins = np.linspace(-1, 1, 21)
            for ax, name in zip(axes[0], pairs):
                for label in classes:
                    taus = [r[f"tau_{name}"] for r in result.instances if str(r["pred"]) == label]
                    taus = [t for t in taus if t is not None and np.isfinite(t)]
                    ax.hist(taus, bins=bins, alpha=0.6, label=f"pred {label} (n={len(taus)})")
                ax.axvline(0, color="grey", lw=0.8)
                ax.set_title(name.replace("_vs_", " vs "))
                ax.set_xlabel("Kendall τ")
                ax.set_xlim(-1, 1)
            axes[0][0].set_ylabel("instances")
            axes[0][-1].legend(fontsize=8)
            fig.suptitle("Attention vs importance: per-instance Kendall τ by predicted class", y=1.04)
            paths += save_figure(fig, directory, "importance_tau_hist")
        heads = [r for r in result.tables.get("heads", []) if r["head"] != "mean"]
        if heads:
            methods = sorted({r["method"] for r in heads})
            n_layers = max(int(r["layer"]) for r in heads) + 1
            n_heads = max(int(r["head"]) for r in heads) + 1
            fig, axes = plt.subplots(
                1, len(methods), figsize=(4.5 * len(methods), 1.5 + 0.45 * n_layers), squeeze=False
            )
            for ax, method in zip(axes[0], methods):
                grid = np.full((n_layers, n_heads), np.nan)
                for r in heads:
                    if r["method"] == method and r["mean"] is not None:
                        grid[int(r["layer"]), int(r["head"])] = r["mean"]
                image = ax.imshow(grid, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
                for (layer, head), value in np.ndenumerate(grid):
                    ax.text(head, layer, f"{value:.2f}", ha="center", va="center", fontsize=8)
                ax.set_title(f"mean τ: attention vs {method}")
                ax.set_xlabel("head")
                ax.set_ylabel("layer")
                ax.set_xticks(range(n_heads))
                ax.set_yticks(range(n_layers))
                fig.colorbar(image, ax=ax, shrink=0.8)
            paths += save_figure(fig, directory, "importance_heads")
        return paths


def accuracy(decisions: list[tuple[str | None, str]]) -> dict[str, float]:
    """``accuracy`` of the explained predictions and ``majority_class``, the accuracy of always predicting
    the most frequent gold label of the same instances (the baseline a zero-shot model must beat); {} unlabelled."""
    labelled = [(gold, pred) for gold, pred in decisions if gold is not None]
    if not labelled:
        return {}
    golds = [gold for gold, _ in labelled]
    top = max(golds.count(label) for label in set(golds))
    return {
        "accuracy": sum(gold == pred for gold, pred in labelled) / len(labelled),
        "majority_class": top / len(labelled),
    }


def _items(run: Run) -> str:
    """What the ranked items are for this model family."""
    if hierarchical(run.model):
        return "sentences (HAN's sentence-level attention; token scores summed per sentence)"
    if run.task.task_type == "pair":
        return "passage tokens (attention and gradients over the passage; the question is fixed)"
    return "tokens"


def _pair(instances: list[dict[str, Any]], name: str) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """One pair of methods: its summary entries, its row of the ``pairs`` table, its rows per predicted class."""
    stats = summarise([r[f"tau_{name}"] for r in instances])
    top = summarise([r[f"tau_topk_{name}"] for r in instances])
    significant = _significant([r[f"p_{name}"] for r in instances])
    summary = {f"tau_{name}_mean": stats["mean"], f"tau_{name}_std": stats["std"], f"tau_{name}_significant": significant,
               f"tau_topk_{name}_mean": top["mean"]}
    published = PUBLISHED.get(name, {})
    row = {"pair": name, **stats, "significant": significant, "topk_mean": top["mean"], "topk_std": top["std"],
           **{f"published_{k}": v for k, v in published.items()}}
    by_class = []
    for label in sorted({r["pred"] for r in instances}):
        subset = [r for r in instances if r["pred"] == label]
        by_class.append({"pair": name, "pred": label, **summarise([r[f"tau_{name}"] for r in subset]),
                         "significant": _significant([r[f"p_{name}"] for r in subset])})
    return summary, row, by_class


def _notes(run: Run, options: Any, methods: list[str], pairs: list[tuple[str, str]], excluded: int, heads: bool) -> list[str]:
    """What τ, its items and each method mean here, and what was left out."""
    notes = [
        "τ is Kendall's τ-b (scipy.stats.kendalltau) over the real items of each instance; "
        f"'significant' is the fraction of instances with p <= {SIGNIFICANCE}",
        f"top-k τ: τ over the union of each method's top {options.topk} items (Jain & Wallace's variant)",
        f"items: {_items(run)}; the explained attention is layer {run.model.explained_layer} "
        "(mean over heads and real queries)",
        "gradient: |Σ_d ∂ŷ/∂e·e| with every attention layer detached; ŷ = predicted-class probability",
        "loo: output change (|Δŷ| binary, TVD multi-class) when the item is removed from the input",
        f"excluded {excluded} instance(s) with fewer than 2 items (no ranking to compare)",
        "instances where a method gives constant scores have τ = NaN; counted as n_nan, not averaged",
    ]
    if "ig" in methods:
        notes.append(f"ig: Integrated Gradients, zero baseline, {options.ig_steps} steps, |Σ_d attribution|")
    if "loo" in methods and options.loo_tokens is not None:
        notes.append(f"loo is APPROXIMATE (--loo-tokens {options.loo_tokens}): only each instance's {options.loo_tokens} items of "
                     "highest gradient importance were removed, the others score 0 (so τ(gradient, loo) is inflated by construction); "
                     "τ with loo is not Jain & Wallace's")
    if REFERENCE not in pairs:
        notes.append("no gradient-vs-LOO reference row: it needs both gradient and loo in --methods")
    if heads:
        notes.append("per layer and head: table 'heads' (head 'mean' = the head-averaged attention of the layer)")
    return notes
