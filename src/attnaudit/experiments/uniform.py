"""Uniform-attention baseline (Wiegreffe & Pinter 2019, §3.1): does the task need attention?

The same architecture is trained with attention frozen to uniform over the real tokens in
every layer (:func:`attnaudit.models.interface.freeze_uniform` applied in every forward, training
and evaluation), with the base run's data, config, settings and dev selection; one sub-run
per seed in ``RUN/subruns/uniform/seed-<s>``. Its test score is reported beside the base
model's. When uniform attention does as well, learned attention is not needed for the task,
and its weights cannot be expected to say why the model decides (W&P's first test).
The uniform model's distance from the base (JSD of attention, TVD of predictions) is the
"uniform" point of the global-adversary figure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnaudit.data.types import Example
from attnaudit.experiments.common.published import compare
from attnaudit.experiments.common.rows import identity_rows
from attnaudit.experiments.experiment import AuditSettings, Experiment, Result, register
from attnaudit.plotting import save_figure
from attnaudit.progress import status
from attnaudit.run import Run
from attnaudit.training.adversary import (
    SubRun,
    Variant,
    base_scores,
    base_seed,
    frozen_uniform,
    subrun_dir,
    train_variant,
    trainable_reason,
)
from attnaudit.training.trainer import score_key

# Within this many points of the base's score, uniform attention counts as "as good".
TOLERANCE = 0.01


UNIFORM = Variant(key={"kind": "uniform"}, interventions=frozen_uniform)


def uniform_subrun(run: Run, seed: int, epochs: int | None = None) -> SubRun:
    """The uniform-attention model of ``seed`` (trained, or loaded when finished)."""
    return train_variant(run, subrun_dir(run, "uniform", f"seed-{seed}"), UNIFORM, epochs=epochs, seed=seed, label=f"uniform seed {seed}")


@register
class UniformBaseline(Experiment):
    """Train with attention frozen to uniform; compare its test score with the base model's."""

    name = "uniform"
    retrains = True
    settings = AuditSettings(
        rank=60,
        options={"epochs": 3},
        demo={"full": {"epochs": 2}, "quick": {"epochs": 1}},
        instance_effects={
        "tvd": ("output change (TVD) of the model trained with uniform attention", "desc"),
        "agreement": ("share of uniform-attention models predicting the base model's class", "asc"),
    },
    )
    description = "train the same model with attention frozen to uniform; its test score beside the base's (is attention needed?)"
    paper = "Wiegreffe & Pinter 2019, §3.1"

    @dataclass
    class Options:
        seeds: list[int] = field(
            default_factory=list, metadata={"help": "Training seeds of the uniform model(s) (default: the base run's seed)."}
        )
        epochs: int | None = field(default=None, metadata={"help": "Training epochs (default: the base run's)."})

    def applies(self, run: Run) -> str | None:
        return trainable_reason(run)

    def run(self, run: Run, examples: list[Example], options: Any, seed: int = 0) -> Result:
        seeds = list(dict.fromkeys(options.seeds)) or [base_seed(run)]
        key = score_key(run.task.task_type)
        base = base_scores(run)
        table = [{"model": "base (learned attention)", "seed": base_seed(run), f"dev_{key}": base["dev"][key], f"test_{key}": base["test"][key]}]
        comparisons = []
        for n, s in enumerate(seeds, 1):
            status(f"uniform: model {n}/{len(seeds)} (seed {s})")
            sub = uniform_subrun(run, s, options.epochs)
            comparison = compare(run, sub.model, examples, sub.interventions)
            comparisons.append(comparison)
            table.append(
                {
                    "model": "uniform attention",
                    "seed": s,
                    f"dev_{key}": sub.metrics["dev"][key],
                    f"test_{key}": sub.metrics["test"][key],
                    "mean_jsd": float(np.mean(comparison["jsd"])),
                    "mean_tvd": float(np.mean(comparison["tvd"])),
                    "epochs": sub.metrics.get("epochs"),
                    "trained_now": sub.trained,
                }
            )
        uniform_scores = [row[f"test_{key}"] for row in table[1:]]
        jsd_mean = np.mean([c["jsd"] for c in comparisons], 0)
        tvd_mean = np.mean([c["tvd"] for c in comparisons], 0)
        instances = identity_rows(run, examples, comparisons[0])
        for i, row in enumerate(instances):
            agreement = float(np.mean([c["agreement"][i] for c in comparisons]))
            row.update(jsd=float(jsd_mean[i]), tvd=float(tvd_mean[i]), agreement=agreement)
        summary = {
            "metric": key,
            f"base_test_{key}": base["test"][key],
            f"uniform_test_{key}": float(np.mean(uniform_scores)),
            "difference": base["test"][key] - float(np.mean(uniform_scores)),
            "seeds": len(seeds),
            "mean_jsd": float(np.mean(jsd_mean)),
            "mean_tvd": float(np.mean(tvd_mean)),
        }
        meta = {
            "notes": [
                "uniform attention = every attention layer frozen to uniform over real tokens in training and evaluation",
                "test scores are on the whole test split; mean_jsd / mean_tvd (uniform vs base) on the instances tested"
                + (f"; uniform score averaged over {len(seeds)} seeds" if len(seeds) > 1 else ""),
            ],
            "published": {
                "claim": "W&P Table 2: on some data sets (e.g. AG News, 20News) uniform attention is as good as learned; "
                "on SST learned attention helps only slightly, on others (Diabetes, Anemia) clearly",
            },
        }
        return Result(self.name, summary, instances, {"scores": table}, meta)

    def plot(self, result: Result, directory: Path) -> list[Path]:
        from attnaudit.plotting import pyplot

        plt = pyplot()

        key = result.summary["metric"]
        rows = result.tables["scores"]
        fig, ax = plt.subplots(figsize=(4.2, 3.2), layout="constrained")
        labels = [f"{r['model'].split(' ')[0]}\nseed {r['seed']}" for r in rows]
        ax.bar(range(len(rows)), [r[f"test_{key}"] for r in rows], color=["#4c72b0"] + ["#dd8452"] * (len(rows) - 1))
        ax.set_xticks(range(len(rows)), labels)
        ax.set_ylabel(f"test {key}")
        low = min(r[f"test_{key}"] for r in rows)
        ax.set_ylim(max(0.0, low - 0.1), 1.0)
        ax.set_title("learned vs uniform attention")
        return save_figure(fig, directory, "uniform_scores")

    def verdict(self, result: Result) -> list[dict[str, Any]]:
        s = result.summary
        diff = s["difference"]
        if diff <= TOLERANCE:
            meaning = (
                f"uniform attention is as good (within {TOLERANCE:g}): the task does not need learned attention, "
                "so its weights need not reflect why the model decides"
            )
        else:
            meaning = f"learned attention improves the test {s['metric']} by {diff:.3f}: the model relies on it"
        return [{"statistic": "difference", "value": diff, "published": "", "interpretation": meaning}]
