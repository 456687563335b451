"""Change of activation: evaluate a trained Transformer with another attention normaliser.

The first test of the sparse-attention study (Drozdyuk et al., "Is Sparse Attention a Better
Explanation?", Table 1 "change of activation"): a classifier trained with softmax, entmax15 or sparsemax is evaluated
with every normaliser swapped in at inference, on all layers at once. If accuracy barely
moves, the exact shape of the distribution (dense vs sparse) is not what the model relies
on. Hugging Face encoders and decoders (trained with softmax) take the same swap through their
registered attention function; a decoder keeps its causal mask under every normaliser. The helpers
it shares with the shuffle and key tests (applicability, gold labels, per-layer JSD, attention
heatmaps) live in :mod:`attnaudit.experiments.common`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnaudit.data.types import Example
from attnaudit.experiments.common.applies import self_attention_classifier_reason
from attnaudit.experiments.common.measures import layer_jsd
from attnaudit.experiments.common.passes import base_pass
from attnaudit.experiments.common.plots import plot_attention_rows
from attnaudit.experiments.common.rows import ATTENTION_TABLE, attention_rows, batch_labels
from attnaudit.experiments.experiment import AuditSettings, Experiment, Result, register, summarise
from attnaudit.models.interface import AttentionTrace, Intervention
from attnaudit.models.normalisers import check_normaliser
from attnaudit.plotting import save_figure
from attnaudit.progress import track
from attnaudit.run import Run

NORMALISERS = ["softmax", "entmax15", "sparsemax"]


def zero_fraction(trace: AttentionTrace, causal: bool = False) -> Tensor:
    """Per instance, the fraction of exactly-zero weights among real (query, key) pairs, all layers
    (``causal``: the pairs a decoder's query may read, the key at or before it; later ones are always 0)."""
    first = trace.layers[0].weights
    zeros = torch.zeros(first.shape[0], dtype=torch.float64, device=first.device)
    count = torch.zeros_like(zeros)
    for layer in trace.layers:
        qmask = layer.query_mask if layer.query_mask is not None else layer.mask
        pairs = qmask[:, None, :, None] & layer.mask[:, None, None, :]
        if causal:
            pairs = pairs & torch.ones(layer.weights.shape[2:], dtype=torch.bool, device=pairs.device).tril()
        pairs = pairs.expand_as(layer.weights)
        zeros += ((layer.weights == 0) & pairs).sum((1, 2, 3))
        count += pairs.sum((1, 2, 3))
    return zeros / count.clamp_min(1.0)


@register
class ActivationSwap(Experiment):
    """The test of this module (its docstring gives the method, options and outputs)."""

    name = "activation-swap"
    settings = AuditSettings(
        instance_effects={
        "jsd_sparsemax": ("attention JSD with sparsemax swapped in for the trained normaliser", "desc"),
        "correct_sparsemax": ("right with sparsemax swapped in (1) or not (0)", "asc"),
        "jsd_entmax15": ("attention JSD with 1.5-entmax swapped in", "desc"),
        "correct_entmax15": ("right with 1.5-entmax swapped in (1) or not (0)", "asc"),
        "jsd_softmax": ("attention JSD with softmax swapped in", "desc"),
    },
        rank=7,
        transformers_only=True,
        decoder_options={"batch_size": 8},
    )
    description = "Accuracy of a Transformer classifier evaluated with softmax / entmax15 / sparsemax swapped in"
    paper = "Drozdyuk et al., Is Sparse Attention a Better Explanation? (Table 1: change of activation)"
    examples = ("runs/sst2-transformer --limit 200 --data-dir ../shared/data",)

    @dataclass
    class Options:
        normalisers: list[str] = field(
            default_factory=lambda: list(NORMALISERS),
            metadata={"help": "Normalisers to evaluate with (softmax, entmax15, sparsemax, entmax:<alpha>)."},
        )
        batch_size: int = field(default=64, metadata={"help": "Instances per forward pass."})
        show: int = field(default=3, metadata={"help": "Sentences shown in the attention heatmap."})

    def applies(self, run: Run) -> str | None:
        return self_attention_classifier_reason(run)

    def run(self, run: Run, examples: list[Example], options: Any, seed: int = 0) -> Result:
        names = [check_normaliser(n) for n in options.normalisers]
        trained = run.config.attention
        model = run.model
        model.eval()
        correct: dict[str, list[Tensor]] = {"original": [], **{n: [] for n in names}}
        divergence: dict[str, list[list[Tensor]]] = {n: [] for n in names}
        sparsity: dict[str, list[Tensor]] = {"original": [], **{n: [] for n in names}}
        heatmaps: list[dict[str, Any]] = []
        positions: list[int] = []
        total = -(-len(examples) // options.batch_size)
        with torch.no_grad():
            for indices, batch in track(run.sorted_batches(examples, options.batch_size), "activation swap", total=total):
                positions += indices
                gold = batch_labels(batch)
                cache = model.encode(batch)
                base = base_pass(model, batch)
                correct["original"].append(base.logits.argmax(-1) == gold)
                sparsity["original"].append(zero_fraction(base.trace, model.causal))
                heatmaps += attention_rows(run, batch, base.trace, f"trained ({trained})", options.show, indices)
                for name in names:
                    # the trained normaliser swapped in is the model itself: its pass is the base one
                    out = base if name == trained else model.decode(cache, [Intervention(normaliser=name)])
                    correct[name].append(out.logits.argmax(-1) == gold)
                    divergence[name].append(layer_jsd(base.trace, out.trace))
                    sparsity[name].append(zero_fraction(out.trace, model.causal))
                    heatmaps += attention_rows(run, batch, out.trace, f"-> {name}", options.show, indices)

        back = torch.argsort(torch.tensor(positions))  # batches ran by length: back to the examples' order
        flat = {k: torch.cat(v).float()[back] for k, v in correct.items()}
        zeros = {k: torch.cat(v)[back] for k, v in sparsity.items()}
        n_layers = model.num_attention_layers
        per_layer = {
            n: [torch.cat([b[layer] for b in divergence[n]])[back] for layer in range(n_layers)] for n in names
        }
        heatmaps.sort(key=lambda row: row["index"])  # stable: settings keep their order
        original = float(flat["original"].mean())
        rows = []
        for name in names:
            acc = float(flat[name].mean())
            row: dict[str, Any] = {
                "normaliser": name,
                "trained": name == trained,
                "accuracy": acc,
                "drop": original - acc,
                "zero_fraction": float(zeros[name].mean()),
            }
            for layer in range(n_layers):
                row[f"jsd_layer{layer}"] = float(per_layer[name][layer].mean())
            rows.append(row)
        swapped = [r["accuracy"] for r in rows if not r["trained"]]
        summary: dict[str, Any] = {
            "trained_normaliser": trained,
            "accuracy_original": original,
            "zero_fraction_original": float(zeros["original"].mean()),
            **{f"accuracy_{r['normaliser']}": r["accuracy"] for r in rows},
            "accuracy_swap_mean": summarise(swapped)["mean"],
        }
        instances = []
        for i, example in enumerate(examples):
            item: dict[str, Any] = {"index": i, "label": example.label, "original_correct": int(flat["original"][i])}
            for name in names:
                item[f"correct_{name}"] = int(flat[name][i])
                item[f"jsd_{name}"] = float(torch.stack([per_layer[name][k][i] for k in range(n_layers)]).mean())
            instances.append(item)
        notes = [
            "the normaliser is swapped on every layer at once at inference; no retraining",
            "jsd_layer<l>: JSD (nats) between the trained and swapped attention of layer l, "
            "mean over heads and real queries; zero_fraction: share of exactly-zero weights over real pairs",
            "accuracy_swap_mean: mean accuracy over the normalisers other than the trained one",
        ]
        return Result(
            test=self.name,
            summary=summary,
            instances=instances,
            tables={"normalisers": rows, ATTENTION_TABLE: heatmaps},
            meta={"notes": notes, "published": {}},
        )

    def verdict(self, result: Result) -> list[dict[str, Any]]:
        """Accuracy under the other normalisers vs the trained one: does the distribution's exact shape matter?"""
        s = result.summary
        before, after = s.get("accuracy_original"), s.get("accuracy_swap_mean")
        if not isinstance(before, (int, float)) or not isinstance(after, (int, float)):
            return super().verdict(result)
        change = 100 * (after - before)
        meaning = (
            f"evaluated with the other normalisers the {s.get('trained_normaliser')} model scores {after:.3f} on average "
            f"(trained: {before:.3f}, {change:+.1f} points): "
            + (
                "its predictions depend on the exact attention distribution"
                if abs(change) >= 5
                else "the exact shape (dense or sparse) of the distribution matters little to its predictions"
            )
        )
        return [{"statistic": "accuracy_swap_mean", "value": after, "published": "", "interpretation": meaning}]

    def plot(self, result: Result, directory: Path) -> list[Path]:
        from attnaudit.plotting import pyplot

        plt = pyplot()

        rows = result.tables.get("normalisers", [])
        paths: list[Path] = []
        if rows:
            fig, ax = plt.subplots(figsize=(4.5, 3.2))
            names = [r["normaliser"] for r in rows]
            ax.bar(names, [r["accuracy"] for r in rows], color=["C1" if r["trained"] else "C0" for r in rows])
            ax.axhline(result.summary["accuracy_original"], color="k", ls="--", lw=1, label="trained")
            ax.set_ylabel("accuracy")
            ax.set_ylim(0, 1)
            ax.set_title(f"evaluated with another normaliser (trained: {result.summary['trained_normaliser']})", fontsize=9)
            ax.legend(fontsize=8)
            paths += save_figure(fig, directory, "activation-swap")
        paths += plot_attention_rows(
            result.tables.get(ATTENTION_TABLE, []), directory, "activation-swap-attention", "attention per normaliser"
        )
        return paths
