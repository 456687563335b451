"""Ground-truth rationale test: does each explanation rank the tokens known to matter first?

Tasks whose examples carry ``Example.rationale`` (the synthetic tasks' planted signal words,
SST trees' strongly polar phrases, bAbI supporting-fact tokens) give a ground truth no
faithfulness test of the attention literature has: the tokens the label depends on. Every
explanation of :mod:`attnaudit.explain` that applies to the model (by default the default ones:
attention, gradient, leave-one-out, Integrated Gradients and, for self-attention models,
attention rollout and the head-summed norm ``‖Σ_h α f_h(x)‖``) scores the items of the
explained layer; per instance we measure how well those scores retrieve the rationale:

* average precision (AP; the mean over instances is the MAP) and ROC-AUC of the scores
  against the binary "in the rationale" labels (scikit-learn);
* precision at k = |rationale|: the share of the k highest-scored units that are in the
  rationale, with ties at the cut-off shared out in expectation (a sparse explanation
  with many exact zeros must not be credited or penalised by index order).

Units are the words of the example (HAN: sentences, a sentence counting as rationale when it
holds a rationale word; Hugging Face models: wordpiece scores summed per word, special
tokens left out). Scores are compared by magnitude (absolute values).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from attnaudit.algorithms.metrics import RATIONALE_METRICS as METRICS
from attnaudit.algorithms.metrics import random_average_precision, score_against
from attnaudit.data.types import Example
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.common.units import instance_units
from attnaudit.experiments.experiment import AuditSettings, Experiment, Result, counted, joined, register, summarise, where
from attnaudit.explain import EXPLANATIONS, default_names, list_explanations
from attnaudit.plotting import save_figure
from attnaudit.progress import track
from attnaudit.run import Run

if TYPE_CHECKING:
    pass


# --------------------------------------------------------------------------- units


# --------------------------------------------------------------------------- scores


# --------------------------------------------------------------------------- the test


@register
class Rationale(Experiment):
    """The test of this module (its docstring gives the method, options and outputs)."""

    name = "rationale"
    settings = AuditSettings(
        rank=2,
        demo={"full": {"ig_steps": 20}, "quick": {"ig_steps": 2}},
    )
    needs_prediction = False  # without a trained head it scores the attention-based explanations only
    description = (
        "Score each explanation (`attnaudit explanations`) against the known rationale tokens: MAP, ROC-AUC "
        "and precision@k"
    )
    paper = "attnaudit ground-truth check (rationales: synthetic tasks, SST phrases, bAbI supporting facts)"
    examples = ("runs/syn --limit 200", "--hf minilm --task synthetic --out results/minilm-rationale --data-dir ../shared/data")

    @dataclass
    class Options:
        methods: list[str] = field(
            default_factory=default_names,
            metadata={
                "help": "Explanations to score (`attnaudit explanations` lists them; default: the default ones); "
                "those the model does not support are skipped with a note."
            },
        )
        ig_steps: int = field(default=20, metadata={"help": "Integrated Gradients steps."})
        batch_size: int = field(default=32, metadata={"help": "Instances per batch."})

    def applies(self, run: Run) -> str | None:
        if run.task.task_type not in ("classification", "pair"):
            return f"a {run.task.task_type} model makes one decision per token; the explanations score one per instance"
        if not run.task.spec and run._data is None:
            return "no task given: the test needs examples with known rationale tokens (e.g. --task synthetic)"
        data = run.data()
        if not any(ex.rationale for ex in data.test + data.dev):
            return f"the examples of task {run.task.spec or data.name!r} carry no rationale"
        return None

    @classmethod
    def explanation_choices(cls) -> list[str]:
        """Every registered explanation."""
        return list(EXPLANATIONS)

    shardable = True

    def plan(self, run: Run, examples: list[Example], options: Any) -> list[int]:
        """Examples with a rationale first (in order: they are batched in order), then the others (only counted)."""
        return sorted(range(len(examples)), key=lambda i: not examples[i].rationale)

    def part(self, run: Run, examples: list[Example], options: Any, seed: int = 0, indices: Sequence[int] | None = None) -> Result:
        unknown = [m for m in options.methods if m not in self.explanation_choices()]
        if unknown:
            raise AttnAuditError(
                f"rationale: unknown method(s) {', '.join(unknown)}; choose {', '.join(self.explanation_choices())}"
            )
        available = {m.name: m for m in list_explanations(run)}
        methods = [m for m in options.methods if m in available]
        if not methods:
            raise AttnAuditError(f"rationale: none of {', '.join(options.methods)} applies to this {run.family} model")
        chosen = [(i, ex) for i, ex in zip(where(examples, indices), examples) if ex.rationale]
        rows: list[dict[str, Any]] = []
        unaligned = 0
        subset = [ex for _, ex in chosen]
        batches = run.batches(subset, options.batch_size)
        offset = 0
        for batch in track(batches, "rationale", total=-(-len(subset) // options.batch_size)):
            scores = {
                m: available[m](run.model, batch, steps=options.ig_steps, seed=seed).detach().cpu().double().numpy()
                for m in methods
            }
            for b in range(len(batch)):
                units = instance_units(run, batch, b)
                index = chosen[offset + b][0]
                if units is None or not units.positive.any():
                    unaligned += 1
                    continue
                n, r = int(units.positive.size), int(units.positive.sum())
                row: dict[str, Any] = {
                    "index": index,
                    "units": n,
                    "rationale_size": r,
                    "random_ap": random_average_precision(n, r),
                    "random_precision_at_k": r / n,
                }
                for m in methods:
                    for metric, value in score_against(units.scores(scores[m][b]), units.positive).items():
                        row[f"{m}_{metric}"] = value
                rows.append(row)
            offset += len(batch)
        return Result(
            test=self.name, instances=rows,
            meta={"methods": methods, "with_rationale": len(chosen), "without": len(examples) - len(chosen), "unaligned": unaligned},
        )

    def merge(self, run: Run, parts: list[Result], options: Any, seed: int = 0) -> Result:
        if not counted(parts, "with_rationale"):
            raise AttnAuditError("rationale: no example of this split has a rationale")
        methods = parts[0].meta["methods"]
        return self._result(run, joined(parts), methods, options, counted(parts, "without"), counted(parts, "unaligned"))

    def _result(
        self, run: Run, rows: list[dict[str, Any]], methods: list[str], options: Any, without: int, unaligned: int
    ) -> Result:
        table: list[dict[str, Any]] = []
        summary: dict[str, Any] = {"n": len(rows)}
        for m in methods:
            stats = {metric: summarise([r[f"{m}_{metric}"] for r in rows]) for metric in METRICS}
            table.append({"method": m, **{k: s["mean"] for k, s in stats.items()}, "n": stats["ap"]["n"]})
            summary.update({f"{m}_{'map' if k == 'ap' else k}": s["mean"] for k, s in stats.items()})
        random_row = {
            "method": "random",
            "ap": summarise([r["random_ap"] for r in rows])["mean"],
            "auc": 0.5,
            "precision_at_k": summarise([r["random_precision_at_k"] for r in rows])["mean"],
            "n": len(rows),
        }
        table.append(random_row)
        summary["random_map"] = random_row["ap"]
        summary["random_precision_at_k"] = random_row["precision_at_k"]
        ranked = [t for t in table[:-1] if math.isfinite(t["ap"])]
        summary["best_method"] = max(ranked, key=lambda t: t["ap"])["method"] if ranked else ""
        skipped = [m for m in options.methods if m not in methods]
        unit = {"han": "sentences (rationale = sentences holding a rationale word)", "hf": "words (wordpiece scores summed)"}
        notes = [
            f"units: {unit.get(run.family, 'words')}; scores compared by magnitude (absolute values)",
            "precision_at_k: k = rationale size; ties at the cut-off count by their positive share",
            "random: the expected AP of a uniformly random ranking (exact) and the rationale share of the units "
            "(precision@k of a random ranking); ROC-AUC of a random ranking is 0.5",
            "roc-auc is undefined (NaN, not averaged) when every unit of an instance is in the rationale",
        ]
        if without:
            notes.append(f"{without} example(s) without a rationale were left out")
        if unaligned:
            notes.append(f"{unaligned} example(s) whose rationale could not be mapped onto the model's items were left out")
        if skipped:
            notes.append(f"not available for this {run.family} model: {', '.join(skipped)}")
        return Result(
            test=self.name,
            summary=summary,
            instances=rows,
            tables={"methods": table},
            meta={
                "notes": notes,
                "methods": methods,
                "published": {
                    "source": "no published counterpart: the tests of Jain & Wallace, Serrano & Smith and "
                    "Wiegreffe & Pinter have no ground-truth rationale",
                },
            },
        )

    def plot(self, result: Result, directory: Path) -> list[Path]:
        from attnaudit.plotting import pyplot

        plt = pyplot()

        table = result.tables.get("methods", [])
        if not table:
            return []
        labels = [t["method"] for t in table]
        x = np.arange(len(labels))
        fig, ax = plt.subplots(figsize=(1.2 * len(labels) + 2.5, 3.4))
        for j, (metric, name) in enumerate((("ap", "MAP"), ("auc", "ROC-AUC"), ("precision_at_k", "precision@k"))):
            values = [np.nan if t[metric] is None else t[metric] for t in table]
            ax.bar(x + (j - 1) * 0.27, values, width=0.27, label=name)
        ax.set_xticks(x, labels)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("score vs rationale")
        ax.set_title("Explanations against the known rationale (higher is better)", fontsize=10)
        ax.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.12), frameon=False)
        return save_figure(fig, directory, "rationale_scores")

    def verdict(self, result: Result) -> list[dict[str, Any]]:
        s = result.summary
        base = s.get("random_map")
        rows = []
        for t in result.tables.get("methods", []):
            if t["method"] == "random" or t["ap"] is None or not math.isfinite(t["ap"]) or base is None:
                continue
            lift = t["ap"] - base
            if lift > 0.5 * (1 - base):
                meaning = "finds the rationale well"
            elif lift > 0.1:
                meaning = "finds the rationale partly"
            elif lift > 0.02:
                meaning = "barely better than a random ranking"
            else:
                meaning = "no better than a random ranking"
            rows.append(
                {
                    "statistic": f"{t['method']}_map",
                    "value": t["ap"],
                    "published": "",
                    "interpretation": f"{t['method']}: MAP {t['ap']:.3f} vs {base:.3f} for a random ranking "
                    f"(precision@k {t['precision_at_k']:.3f}): {meaning}",
                }
            )
        if s.get("best_method"):
            rows.append(
                {
                    "statistic": "best_method",
                    "value": s["best_method"],
                    "published": "",
                    "interpretation": f"{s['best_method']} ranks the known rationale highest",
                }
            )
        return rows
