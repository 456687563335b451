"""Diagnostic guided models (Wiegreffe & Pinter 2019, §3.3): is the attention useful on its own?

A context-free model — the ``average`` encoder (a per-token ``tanh(W e_t)``) with the base's
attention head, embedding and hidden sizes — is trained four ways, each a sub-run in
``RUN/subruns/diagnostic/<setting>-seed-<s>`` with the base run's data, settings and dev
selection:

(a) ``learned``: its own attention, trained jointly;
(b) ``uniform``: attention frozen to uniform over the real tokens;
(c) ``base``: attention frozen to the base model's attention on each instance;
(d) ``adversary``: attention frozen to a global adversary's attention (the ``global-adversary``
    model at ``--adversary-lambda``, trained when missing).

The encoder cannot move information between tokens, so only the imposed weights say which
tokens matter. W&P's reading: if (c) beats (a) and (b), the base's attention carries
task-relevant, model-independent information; an adversary whose attention does worse in (d)
fooled the base model, not the task.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnaudit.data.types import Example
from attnaudit.experiments.experiment import AuditSettings, Experiment, Result, register
from attnaudit.plotting import save_figure
from attnaudit.progress import status
from attnaudit.run import Run
from attnaudit.training.adversary import (
    Variant,
    attention_of,
    base_scores,
    base_seed,
    frozen_uniform,
    subrun_dir,
    train_variant,
    trainable_reason,
)
from attnaudit.training.attention_adversaries import adversary, resolve_init
from attnaudit.training.trainer import score_key

SETTINGS = ("learned", "uniform", "base", "adversary")
GUIDED_ENCODER = "average"


@register
class Diagnostic(Experiment):
    """Train a context-free MLP with learned, uniform, base-model and adversary attention."""

    name = "diagnostic"
    retrains = True
    settings = AuditSettings(
        rank=62,
        options={"epochs": 3},
        demo={"full": {"epochs": 2}, "quick": {"epochs": 1}},
    )
    description = "context-free (average) model with learned / uniform / base-model / adversary attention imposed: test scores"
    paper = "Wiegreffe & Pinter 2019, §3.3"

    @dataclass
    class Options:
        seeds: list[int] = field(
            default_factory=list, metadata={"help": "Training seeds of the guided models (default: the base run's seed)."}
        )
        epochs: int | None = field(default=None, metadata={"help": "Training epochs (default: the base run's)."})
        adversary_lambda: float = field(
            default=0.1, metadata={"help": "λ of the global adversary whose attention guides setting (d)."}
        )
        adversary_init: str = field(
            default="", metadata={"help": "How that adversary starts: scratch or base (default: the task's, see global-adversary --init)."}
        )

    def applies(self, run: Run) -> str | None:
        reason = trainable_reason(run)
        if reason:
            return reason
        if run.task.task_type not in ("classification", "pair") or run.family not in ("bilstm", "cnn", "average"):
            return (
                "the guided model is W&P's context-free average encoder with one attention distribution over the "
                "input tokens; the base must have that kind of attention (bilstm, cnn or average on a "
                "classification/pair task)"
            )
        return None

    def run(self, run: Run, examples: list[Example], options: Any, seed: int = 0) -> Result:
        seeds = list(dict.fromkeys(options.seeds)) or [base_seed(run)]
        key = score_key(run.task.task_type)
        status(f"diagnostic: adversary λ={options.adversary_lambda:g}")
        adv = adversary(run, options.adversary_lambda, seed, options.epochs, options.adversary_init)
        guides = {
            "learned": ({}, None),
            "uniform": ({}, frozen_uniform),
            "base": ({"source": run.info.get("hash")}, attention_of(run.model, [0])),
            "adversary": ({"source": adv.hash, "lambda": options.adversary_lambda}, attention_of(adv.model, [0])),
        }
        base = base_scores(run)
        table = [
            {"setting": f"base model ({run.family})", "seed": base_seed(run), f"dev_{key}": base["dev"][key], f"test_{key}": base["test"][key]},
            {"setting": f"adversary λ={options.adversary_lambda:g} ({run.family})", "seed": seed,
             f"dev_{key}": adv.metrics["dev"][key], f"test_{key}": adv.metrics["test"][key]},
        ]
        summary: dict[str, Any] = {"metric": key, f"base_test_{key}": base["test"][key]}
        for setting in SETTINGS:
            extra, interventions = guides[setting]
            scores = []
            for s in seeds:
                status(f"diagnostic: {setting} attention (seed {s})")
                variant = Variant(
                    key={"kind": "diagnostic", "attention": setting, **extra},
                    interventions=interventions,
                    model={"model": GUIDED_ENCODER},
                )
                sub = train_variant(
                    run, subrun_dir(run, self.name, f"{setting}-seed-{s}"), variant, epochs=options.epochs, seed=s,
                    label=f"diagnostic {setting} seed {s}",
                )
                scores.append(sub.metrics["test"][key])
                table.append(
                    {
                        "setting": f"{GUIDED_ENCODER} + {setting} attention",
                        "seed": s,
                        f"dev_{key}": sub.metrics["dev"][key],
                        f"test_{key}": sub.metrics["test"][key],
                        "macro_f1": sub.metrics["test"].get("macro_f1"),
                        "epochs": sub.metrics.get("epochs"),
                        "trained_now": sub.trained,
                    }
                )
            summary[f"{setting}_guided_test_{key}"] = sum(scores) / len(scores)
        meta = {
            "notes": [
                f"guided model: the {GUIDED_ENCODER} encoder with the base's attention scorer, embedding and hidden sizes; "
                "frozen attention is imposed in training and evaluation",
                "test scores on the whole test split (the --split/--limit options do not apply: each model is scored on test)",
                f"adversary: global-adversary sub-run λ={options.adversary_lambda:g}, seed {seed}, init {resolve_init(run, options.adversary_init)}",
            ],
            "published": {
                "claim": "W&P, diagnostic MLP experiment: the MLP guided by the base LSTM's attention beats the MLP with its own (learned) "
                "attention and with uniform attention; guided by adversarial attention it does worse than guided by the base's",
            },
        }
        return Result(self.name, summary, [], {"scores": table}, meta)

    def plot(self, result: Result, directory: Path) -> list[Path]:
        from attnaudit.plotting import pyplot

        plt = pyplot()

        key = result.summary["metric"]
        names = list(SETTINGS)
        values = [result.summary[f"{s}_guided_test_{key}"] for s in names]
        fig, ax = plt.subplots(figsize=(4.6, 3.3), layout="constrained")
        ax.bar(names, values, color=["#8172b2", "#55a868", "#4c72b0", "#c44e52"])
        ax.axhline(result.summary[f"base_test_{key}"], color="black", linestyle="--", label="base model")
        ax.set_ylim(max(0.0, min(values) - 0.1), 1.0)
        ax.set_ylabel(f"test {key}")
        ax.set_title(f"{GUIDED_ENCODER} model, attention from ...")
        ax.legend(fontsize=8)
        return save_figure(fig, directory, "diagnostic_scores")

    def verdict(self, result: Result) -> list[dict[str, Any]]:
        s = result.summary
        key = s["metric"]
        guided, learned, uniform, adv = (s[f"{k}_guided_test_{key}"] for k in ("base", "learned", "uniform", "adversary"))
        if guided > max(learned, uniform):
            meaning = "the base's attention helps a context-free model more than its own or uniform attention: it carries task information"
        else:
            meaning = "the base's attention does not help the context-free model beyond its own/uniform attention"
        meaning += f"; adversary-guided {adv:.3f} vs base-guided {guided:.3f}"
        return [{"statistic": f"base_guided_test_{key}", "value": guided, "published": "", "interpretation": meaning}]
