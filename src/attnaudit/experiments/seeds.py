"""Variance across random seeds (Wiegreffe & Pinter 2019, §3.2): the adversary's baseline.

The base model is retrained with ``N`` other seeds (default 5) — same data, config and
settings, :func:`attnaudit.training.trainer.train`, each seed a resumable sub-run in
``RUN/subruns/seeds/seed-<s>``. Per instance, each seed model's explained attention is
compared with the base's (JSD, averaged over heads and real query rows) and its prediction
with the base's (TVD; a tagger's averaged over real tokens); the instance's statistic is the
median over seeds. Equally good models already disagree this much, so an adversary's
attention is only remarkable when it is further from the base than this.

:func:`compare` (one model against the base, instance by instance) is shared by the
uniform, global-adversary tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnaudit.data.types import Example
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.common.plots import plot_against_max_attention
from attnaudit.experiments.common.published import compare
from attnaudit.experiments.common.rows import identity_rows
from attnaudit.experiments.experiment import AuditSettings, Experiment, Result, register, summarise
from attnaudit.plotting import save_figure
from attnaudit.progress import status
from attnaudit.run import Run
from attnaudit.training.adversary import (
    base_scores,
    base_seed,
    subrun_dir,
    train_standard,
    trainable_reason,
)
from attnaudit.training.trainer import score_key


@register
class SeedVariance(Experiment):
    """W&P's variance calibration: retrain with other seeds, compare attention and predictions."""

    name = "seeds"
    retrains = True
    settings = AuditSettings(
        rank=63,
        options={"seeds": [1, 2], "epochs": 3},
        demo={"full": {"seeds": [1], "epochs": 2}, "quick": {"seeds": [1], "epochs": 1}},
        instance_effects={"jsd_median": ("attention JSD to models trained with other seeds (median)", "desc")},
    )
    description = "retrain with N other seeds: per-instance attention JSD / prediction TVD from the base (the adversary's baseline)"
    paper = "Wiegreffe & Pinter 2019, §3.2"

    @dataclass
    class Options:
        seeds: list[int] = field(
            default_factory=lambda: [1, 2, 3, 4, 5],
            metadata={"help": "Training seeds of the extra models (the base run's own seed is skipped)."},
        )
        epochs: int | None = field(default=None, metadata={"help": "Training epochs per model (default: the base run's)."})

    def applies(self, run: Run) -> str | None:
        return trainable_reason(run)

    def run(self, run: Run, examples: list[Example], options: Any, seed: int = 0) -> Result:
        own = base_seed(run)
        seeds = list(dict.fromkeys(s for s in options.seeds if s != own))
        notes = [
            "JSD: explained attention layer, averaged over heads and real query rows; TVD: predicted "
            "distributions" + (", averaged over real tokens" if run.task.task_type == "tagging" else "")
            + "; per instance the median over seeds",
        ]
        if own in options.seeds:
            notes.append(f"seed {own} skipped: it is the base run's own seed")
        if not seeds:
            raise AttnAuditError(f"give at least one seed other than the base run's seed {own}")
        key = score_key(run.task.task_type)
        jsds, tvds, table = [], [], []
        for n, s in enumerate(seeds, 1):
            status(f"seeds: model {n}/{len(seeds)} (seed {s})")
            sub = train_standard(run, subrun_dir(run, self.name, f"seed-{s}"), seed=s, epochs=options.epochs)
            comparison = compare(run, sub.model, examples)
            jsds.append(comparison["jsd"])
            tvds.append(comparison["tvd"])
            table.append(
                {
                    "seed": s,
                    f"dev_{key}": sub.metrics["dev"][key],
                    f"test_{key}": sub.metrics["test"][key],
                    "mean_jsd": float(np.mean(comparison["jsd"])),
                    "median_jsd": float(np.median(comparison["jsd"])),
                    "mean_tvd": float(np.mean(comparison["tvd"])),
                    "median_tvd": float(np.median(comparison["tvd"])),
                    "epochs": sub.metrics.get("epochs"),
                    "trained_now": sub.trained,
                }
            )
        jsd_all, tvd_all = np.stack(jsds, 1), np.stack(tvds, 1)
        instances = identity_rows(run, examples, comparison)
        for i, row in enumerate(instances):
            row.update(
                jsd_median=float(np.median(jsd_all[i])),
                jsd_max=float(jsd_all[i].max()),
                tvd_median=float(np.median(tvd_all[i])),
                tvd_max=float(tvd_all[i].max()),
                **{f"jsd_seed{s}": float(jsd_all[i, j]) for j, s in enumerate(seeds)},
                **{f"tvd_seed{s}": float(tvd_all[i, j]) for j, s in enumerate(seeds)},
            )
        scores = [row[f"test_{key}"] for row in table]
        jsd_stats = summarise(np.median(jsd_all, 1).tolist())
        tvd_stats = summarise(np.median(tvd_all, 1).tolist())
        summary = {
            "seeds": len(seeds),
            "metric": key,
            f"base_test_{key}": base_scores(run)["test"][key],
            f"seeds_test_{key}_mean": float(np.mean(scores)),
            f"seeds_test_{key}_std": float(np.std(scores)),
            "median_jsd": jsd_stats["median"],
            "mean_jsd": jsd_stats["mean"],
            "median_tvd": tvd_stats["median"],
            "mean_tvd": tvd_stats["mean"],
        }
        meta = {
            "notes": notes,
            "published": {
                "claim": "W&P (Fig. 3): attention of models differing only in the seed can already be far apart "
                "(high JSD at low TVD), more so on some data sets (e.g. SST) than others; compare adversaries to this",
            },
        }
        return Result(self.name, summary, instances, {"seeds": table}, meta)

    def plot(self, result: Result, directory: Path) -> list[Path]:
        from attnaudit.plotting import pyplot

        plt = pyplot()

        frame = result.frame()
        paths = plot_against_max_attention(
            frame, "jsd_median", "median JSD over seeds", "seed variance of attention", directory, "seeds_jsd_vs_max_attention"
        )
        fig, ax = plt.subplots(figsize=(4.6, 3.6), layout="constrained")
        ax.scatter(frame["jsd_median"], frame["tvd_median"], s=8, alpha=0.5, color="#4c72b0")
        ax.set_xlabel("JSD(attention) from base, median over seeds")
        ax.set_ylabel("TVD(prediction) from base, median")
        ax.set_title(f"{result.summary.get('seeds', '?')} seeds vs base (n={len(frame)})")
        return paths + save_figure(fig, directory, "seeds_jsd_tvd")

    def verdict(self, result: Result) -> list[dict[str, Any]]:
        s = result.summary
        return [
            {
                "statistic": "median_jsd",
                "value": s.get("median_jsd"),
                "published": "",
                "interpretation": "attention differences that retraining with another seed already produces "
                f"(median JSD {s.get('median_jsd', float('nan')):.3f} at median TVD {s.get('median_tvd', float('nan')):.3f}); "
                "an adversary's attention is only evidence against this model's attention if it is further away",
            }
        ]
