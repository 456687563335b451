"""Shuffling: randomly permute each attention row over the real keys and measure accuracy.

Sparse-attention study, Table 1 "shuffling" (after Jain & Wallace's permutation test, here
on every layer of a Transformer): the weights a query assigns are kept but moved to other
tokens. A large accuracy drop means the model depends on *where* attention goes; the study
reports that shuffling costs an entmax15 Transformer far more than a softmax one.
Settings: one layer at a time (the other layers untouched) and all layers at once;
``repeats`` independent permutations per setting, each from its own seeded generator. A causal
decoder's query rows are permuted over the keys they may read (the token and those before it), so
no token reads a later one. Hugging Face encoders and decoders are shuffled through the same
weight intervention; a zero-shot LLM's accuracy is that of its verbalizer decision.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnaudit.data.types import Example
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.common.applies import self_attention_classifier_reason
from attnaudit.experiments.common.passes import base_pass
from attnaudit.experiments.common.plots import plot_attention_rows
from attnaudit.experiments.common.rows import ATTENTION_TABLE, attention_rows, batch_labels
from attnaudit.experiments.common.seeding import seeded_generator
from attnaudit.experiments.experiment import AuditSettings, Experiment, Result, register, summarise
from attnaudit.models.interface import Intervention
from attnaudit.plotting import save_figure
from attnaudit.progress import track
from attnaudit.run import Run

PUBLISHED = {
    "shuffle_drop_points": {"softmax": 7.0, "entmax15": 26.75},
    "source": "sparse-attention study, Table 1 (Transformer on SST-2), as quoted in the attnaudit brief",
}


def permute_rows(weights: Tensor, key_mask: Tensor, generator: torch.Generator, causal: bool = False) -> Tensor:
    """Each row of ``weights`` (B,H,Q,K) randomly permuted over the real keys of ``key_mask`` (B,K)
    (``causal``: over the real keys at or before the row's query position, those it may read).

    Padding keys keep weight 0 and real keys need not be contiguous (pair inputs pad the
    text before the query): random sort keys with unreadable keys forced last pick a random
    order of the readable keys, which is then written back onto them in ascending order.
    """
    readable = key_mask[:, None, None, :].expand(-1, 1, weights.shape[2], -1)
    if causal:
        readable = readable & torch.ones(weights.shape[2:], dtype=torch.bool, device=weights.device).tril()
    noise = torch.rand(weights.shape, generator=generator).to(weights.device)
    noise = noise.masked_fill(~readable, 2.0)
    source = noise.argsort(-1)
    target = (~readable).to(torch.int8).argsort(dim=-1, stable=True).expand_as(weights)
    return torch.zeros_like(weights).scatter(-1, target, weights.gather(-1, source))


def _shuffler(generator: torch.Generator, causal: bool) -> Callable[[Tensor, Tensor], Tensor]:
    """A weights intervention permuting rows with ``generator`` (consumed batch after batch)."""
    return lambda w, mask: permute_rows(w, mask, generator, causal)


@register
class Shuffle(Experiment):
    """The test of this module (its docstring gives the method, options and outputs)."""

    name = "shuffle"
    settings = AuditSettings(
        rank=8,
        transformers_only=True,
        decoder_options={"per_layer": False, "repeats": 2, "batch_size": 8},
        demo={"full": {"repeats": 3}, "quick": {"repeats": 1}},
    )
    # Each layer alone costs about L/2 forward passes per repeat (a restart at that layer): on a 30-layer LLM
    # the audit shuffles all layers at once only (`attnaudit run shuffle --per-layer` for the rest).
    description = "Accuracy when each attention row is randomly permuted over real keys, per layer and in all layers"
    paper = "Drozdyuk et al., Is Sparse Attention a Better Explanation? (Table 1: shuffling)"
    examples = ("runs/sst2-transformer --limit 200 --data-dir ../shared/data",)

    @dataclass
    class Options:
        repeats: int = field(default=5, metadata={"help": "Independent permutations per setting (mean ± std)."})
        per_layer: bool = field(
            default=True, metadata={"help": "Also shuffle one layer at a time (off: all layers at once only)."}
        )
        batch_size: int = field(default=64, metadata={"help": "Instances per forward pass."})
        show: int = field(default=3, metadata={"help": "Sentences shown in the attention heatmap."})

    def applies(self, run: Run) -> str | None:
        return self_attention_classifier_reason(run)

    def run(self, run: Run, examples: list[Example], options: Any, seed: int = 0) -> Result:
        if options.repeats < 1:
            raise AttnAuditError(f"--repeats must be at least 1, got {options.repeats}")
        model = run.model
        model.eval()
        n_layers = model.num_attention_layers
        # Setting index s: 0..L-1 one layer, L all layers at once.
        settings = [f"layer{layer}" for layer in range(n_layers)] + ["all"]
        chosen = range(len(settings)) if options.per_layer else [n_layers]
        generators = {(s, r): seeded_generator(seed, r, s) for s in chosen for r in range(options.repeats)}
        base_correct, correct, heatmaps = _passes(run, examples, options, chosen, generators)
        heatmaps.sort(key=lambda row: row["index"])  # stable: settings keep their order
        accuracy_original = float(base_correct.mean())
        rows = []
        summary: dict[str, Any] = {"trained_normaliser": run.config.attention, "accuracy_original": accuracy_original}
        for s in chosen:
            setting = settings[s]
            accs = [float(correct[(s, r)].mean()) for r in range(options.repeats)]
            stats = summarise(accs)
            rows.append(
                {
                    "setting": setting,
                    "layer": s if s < n_layers else None,
                    "accuracy_mean": stats["mean"],
                    "accuracy_std": stats["std"],
                    "drop_mean": accuracy_original - stats["mean"],
                    "repeats": options.repeats,
                }
            )
            summary[f"accuracy_shuffle_{setting}_mean"] = stats["mean"]
            summary[f"accuracy_shuffle_{setting}_std"] = stats["std"]
        summary["drop_all_mean"] = accuracy_original - summary["accuracy_shuffle_all_mean"]
        instances = []
        for i, example in enumerate(examples):
            item: dict[str, Any] = {"index": i, "label": example.label, "original_correct": int(base_correct[i])}
            for s in chosen:
                setting = settings[s]
                item[f"correct_{setting}"] = float(np.mean([float(correct[(s, r)][i]) for r in range(options.repeats)]))
            instances.append(item)
        notes = [
            "each attention row (every head and query) is permuted over the real keys after the normaliser; "
            "padding keeps weight 0"
            + ("; a causal decoder's row over the keys it may read (itself and earlier)" if model.causal else ""),
            f"accuracy is mean ± std (population) over {options.repeats} seeded permutations per setting; "
            "correct_<setting> per instance is the share of repeats it stayed correct",
            "the study's 'shuffling' row corresponds to setting 'all' (identical to layer0 for a 1-layer model)",
        ]
        if not options.per_layer:
            notes.append("one layer at a time: not run (--per-layer runs it; each layer costs a rerun from that layer)")
        return Result(
            test=self.name,
            summary=summary,
            instances=instances,
            tables={"settings": rows, ATTENTION_TABLE: heatmaps},
            meta={"notes": notes, "published": PUBLISHED},
        )

    def verdict(self, result: Result) -> list[dict[str, Any]]:
        """Accuracy lost when every layer's attention is shuffled, beside the study's SST-2 drop."""
        s = result.summary
        drop, before = s.get("drop_all_mean"), s.get("accuracy_original")
        if not isinstance(drop, (int, float)) or not isinstance(before, (int, float)):
            return super().verdict(result)
        normaliser = s.get("trained_normaliser", "")
        paper = (result.meta.get("published") or {}).get("shuffle_drop_points", {}).get(normaliser)
        points = 100 * drop
        degree = "heavily" if points >= 10 else "somewhat" if points >= 2 else "hardly"
        return [
            {
                "statistic": "drop_all_mean",
                "value": drop,
                "published": f"{paper:g} points ({normaliser}, Transformer on SST-2)" if paper is not None else "",
                "interpretation": f"shuffling attention in every layer lowers accuracy by {points:.1f} points (from "
                f"{before:.3f}): the model {degree} relies on where its attention falls",
            }
        ]

    def plot(self, result: Result, directory: Path) -> list[Path]:
        from attnaudit.plotting import pyplot

        plt = pyplot()

        rows = result.tables.get("settings", [])
        paths: list[Path] = []
        if rows:
            fig, ax = plt.subplots(figsize=(1.2 * len(rows) + 2.5, 3.2))
            x = np.arange(len(rows))
            ax.errorbar(
                x, [r["accuracy_mean"] for r in rows], yerr=[r["accuracy_std"] or 0.0 for r in rows],
                fmt="o", capsize=4, label="shuffled (mean ± std)",
            )
            ax.axhline(result.summary["accuracy_original"], color="k", ls="--", lw=1, label="original")
            ax.set_xticks(x, [r["setting"] for r in rows])
            ax.set_xlabel("attention shuffled in")
            ax.set_ylabel("accuracy")
            ax.set_ylim(0, 1.02)
            ax.set_title(f"shuffled attention ({result.summary['trained_normaliser']})", fontsize=9)
            ax.legend(fontsize=8)
            paths += save_figure(fig, directory, "shuffle")
        paths += plot_attention_rows(
            result.tables.get(ATTENTION_TABLE, []), directory, "shuffle-attention", "original vs shuffled attention"
        )
        return paths


def _passes(
    run: Run, examples: list[Example], options: Any, chosen: Sequence[int], generators: dict[tuple[int, int], torch.Generator]
) -> tuple[Tensor, dict[tuple[int, int], Tensor], list[dict[str, Any]]]:
    """The model's passes, unchanged and with each chosen setting's rows shuffled (setting s < L: layer s alone; L: every
    layer), batched by length: per example (in the examples' order) whether the decision is right, and the heatmap rows."""
    model = run.model
    n_layers = model.num_attention_layers
    original: list[Tensor] = []
    shuffled: dict[tuple[int, int], list[Tensor]] = {key: [] for key in generators}
    heatmaps: list[dict[str, Any]] = []
    positions: list[int] = []
    total = -(-len(examples) // options.batch_size)
    with torch.no_grad():
        for indices, batch in track(run.sorted_batches(examples, options.batch_size), "shuffle", total=total):
            positions += indices
            gold = batch_labels(batch)
            cache = model.encode(batch)
            # one layer at a time restarts from the states entering it: those need the whole trace
            base = model.decode(cache) if options.per_layer else base_pass(model, batch)
            original.append(base.logits.argmax(-1) == gold)
            heatmaps += attention_rows(run, batch, base.trace, "original", options.show, indices)
            for s in chosen:
                for r in range(options.repeats):
                    fn = _shuffler(generators[(s, r)], model.causal)
                    if s < n_layers:
                        # Layers before s are unchanged: restart the model at layer s.
                        out = model.decode(model.cache_at(base.trace, s, cache), [Intervention(layer=s, weights=fn)])
                    else:
                        out = model.decode(cache, [Intervention(weights=fn)])
                    shuffled[(s, r)].append(out.logits.argmax(-1) == gold)
                    if s == n_layers and r == 0:
                        heatmaps += attention_rows(run, batch, out.trace, "shuffled (all layers)", options.show, indices)
    back = torch.argsort(torch.tensor(positions))  # batches ran by length: back to the examples' order
    base_correct = torch.cat(original).float()[back]
    correct = {key: torch.cat(v).float()[back] for key, v in shuffled.items()}
    return base_correct, correct, heatmaps
