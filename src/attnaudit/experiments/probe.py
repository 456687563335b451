"""Attention probes (the CoNLL-2000 tagging study, Table 2): how much task information do
attention distributions carry?

A fresh model of the base's architecture is trained with its attention replaced, in every
layer and for every train/dev/test instance, by the distributions of a *source* model: the
original (base) model or a global adversary at a chosen λ (``global-adversary`` sub-runs,
trained when missing). The source is fixed and run in eval mode on the same batch, which is
exactly replaying its saved distributions. Two probe variants:

* ``frozen`` (the study's): the standard Transformer with ``freeze_to(source)`` — embeddings,
  value/output projections, feed-forward blocks and classifier are trained, the attention
  computation is replaced (its query/key projections get no gradient);
* ``context`` (stricter): no query/key path and no residual around attention — each token's
  representation is only ``Σ_j α_ij V x_j`` (per head, then the output projection and the
  feed-forward block), so everything a token learns about its context and even about itself
  passes through the saved weights.

Table: the probe's test score per source × variant (each a sub-run in
``RUN/subruns/probe/<source>-<variant>-seed-<s>``), beside the source model's own score.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from attnaudit.data.types import Example
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.common.published import PUBLISHED_TAGGING
from attnaudit.experiments.experiment import AuditSettings, Experiment, Result, register
from attnaudit.models import ModelConfig, build_model
from attnaudit.models.interface import (
    AttentionLayer,
    AttentionModel,
    Intervention,
    uniform_weights,
)
from attnaudit.models.normalisers import apply_weight_interventions
from attnaudit.models.transformer import merge_heads, split_heads
from attnaudit.plotting import save_figure
from attnaudit.progress import status
from attnaudit.run import Run
from attnaudit.training.adversary import (
    Variant,
    attention_of,
    base_scores,
    base_seed,
    subrun_dir,
    train_variant,
    trainable_reason,
)
from attnaudit.training.attention_adversaries import adversary, check_lambdas, resolve_init
from attnaudit.training.trainer import score_key

VARIANTS = ("frozen", "context")
PUBLISHED = {
    "original/frozen": 0.90,
    "adversary λ=0.2/frozen": 0.90,
    "adversary λ=3/frozen": 0.89,
    "source": "CoNLL-2000 sequence-tagging attention study, Table 2: probe chunk F1 with the original model's "
    "attention 0.90, with adversarial attention (λ=0.2) 0.90, (λ=3) 0.89",
}


class ContextLayer(nn.Module):
    """A Transformer layer without query/key path or residual: ``out_i = FFN(LN(W_O Σ_j α_ij W_V x_j))``.

    The weights α must come from an intervention (a tensor or a function of a placeholder);
    there is nothing to compute them from.
    """

    def __init__(self, d_model: int, heads: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.attention_norm = nn.LayerNorm(d_model)
        self.ffn = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))
        self.ffn_norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, x: Tensor, mask: Tensor, interventions: Sequence[Intervention] = (), name: str = ""
    ) -> tuple[Tensor, AttentionLayer]:
        if not any(iv.weights is not None for iv in interventions):
            raise AttnAuditError("the context-only probe has no query/key path: its attention must be supplied (freeze_to)")
        size, length, _ = x.shape
        placeholder = uniform_weights(x.new_zeros(size, self.heads, length, length), mask)
        weights = apply_weight_interventions(placeholder, mask, interventions)
        values = split_heads(self.v_proj(x), self.heads)
        h = self.attention_norm(self.dropout(self.out_proj(merge_heads(weights @ values))))
        out = self.ffn_norm(h + self.dropout(self.ffn(h)))
        record = AttentionLayer(weights=weights, mask=mask, inputs=x, values=values, query_mask=mask, name=name)
        return out, record


def build_context_probe(config: ModelConfig) -> AttentionModel:
    """The base's Transformer (embeddings, positions, head) with every layer a :class:`ContextLayer`."""
    model = build_model(config)
    model.layers = nn.ModuleList(
        ContextLayer(config.d_model, config.heads, config.d_ff, config.dropout) for _ in range(config.layers)
    )
    return model


@register
class AttentionProbe(Experiment):
    """Train fresh models on top of saved attention (original / adversarial) and score them."""

    name = "probe"
    retrains = True
    settings = AuditSettings(
        rank=61,
        options={"epochs": 3},
        demo={"full": {"lambdas": [1.0], "variants": ["frozen"], "epochs": 2}, "quick": {"lambdas": [0.2], "variants": ["frozen"], "epochs": 1}},
    )
    description = "fresh Transformer trained on another model's attention (original / adversaries): test score per source x variant"
    paper = "CoNLL-2000 sequence-tagging attention study (Table 2)"
    examples = ("runs/conll --limit 200 --data-dir ../shared/data",)

    @dataclass
    class Options:
        lambdas: list[float] = field(
            default_factory=lambda: [0.2, 3.0], metadata={"help": "λ of the global adversaries whose attention is probed (besides the original's)."}
        )
        variants: list[str] = field(
            default_factory=lambda: list(VARIANTS),
            metadata={"help": "Probe variants: frozen (the study's: attention replaced) and/or context (no query/key path, no residual)."},
        )
        adversary_init: str = field(
            default="", metadata={"help": "How the adversaries start: scratch or base (default: the task's, see global-adversary --init)."}
        )
        adversary_kl_scale: str = field(
            default="token", metadata={"help": "KL normalisation of the tagging adversaries: token or entry (see global-adversary --kl-scale)."}
        )
        seeds: list[int] = field(default_factory=list, metadata={"help": "Training seeds of the probes (default: the base run's seed)."})
        epochs: int | None = field(default=None, metadata={"help": "Training epochs of probes and missing adversaries (default: the base run's)."})

    def applies(self, run: Run) -> str | None:
        reason = trainable_reason(run)
        if reason:
            return reason
        if run.family != "transformer":
            return "the probes replace the self-attention of a Transformer (value/output projections stay trainable); this is not one"
        return None

    def run(self, run: Run, examples: list[Example], options: Any, seed: int = 0) -> Result:
        unknown = sorted(set(options.variants) - set(VARIANTS))
        if unknown or not options.variants:
            raise AttnAuditError(f"--variants must be a subset of {', '.join(VARIANTS)}, got {', '.join(options.variants) or 'none'}")
        seeds = list(dict.fromkeys(options.seeds)) or [base_seed(run)]
        key = score_key(run.task.task_type)
        base = base_scores(run)
        # (label, sub-run slug, model, digest, own score); non-default adversary settings enter
        # both, so probes of differently trained adversaries never share a sub-run directory.
        sources: list[tuple[str, str, AttentionModel, str, float]] = [
            ("original", "original", run.model, str(run.info.get("hash")), base["test"][key])
        ]
        init, scale = resolve_init(run, options.adversary_init), options.adversary_kl_scale
        labels, slugs = [], []
        if scale != "token":
            labels.append(f"{scale} KL")
            slugs.append(f"-kl-{scale}")
        if init != resolve_init(run, ""):
            labels.append(f"{init} init")
            slugs.append(f"-init-{init}")
        if seed != base_seed(run):  # adversaries of another seed (--seed) get probes of their own
            labels.append(f"adversary seed {seed}")
            slugs.append(f"-adversary-seed-{seed}")
        suffix, slug_suffix = (f" ({', '.join(labels)})" if labels else ""), "".join(slugs)
        lambdas = list(dict.fromkeys(float(v) for v in options.lambdas))
        check_lambdas(lambdas)
        for lam in lambdas:
            status(f"probe: adversary λ={lam:g}")
            adv = adversary(run, lam, seed, options.epochs, options.adversary_init, scale)
            sources.append((f"adversary λ={lam:g}{suffix}", f"adversary-{lam:g}{slug_suffix}", adv.model, adv.hash, adv.metrics["test"][key]))
        table, summary = [], {"metric": key, f"base_test_{key}": base["test"][key]}
        for source, slug, model, digest, own in sources:
            interventions = attention_of(model)
            for variant in dict.fromkeys(options.variants):
                scores = []
                for s in seeds:
                    status(f"probe: {source}, {variant} (seed {s})")
                    sub = train_variant(
                        run,
                        subrun_dir(run, self.name, f"{slug}-{variant}-seed-{s}"),
                        Variant(
                            key={"kind": "probe", "variant": variant, "source": digest},
                            interventions=interventions,
                            build=build_context_probe if variant == "context" else None,
                        ),
                        epochs=options.epochs,
                        seed=s,
                        label=f"probe {source} {variant} seed {s}",
                    )
                    scores.append(sub.metrics["test"][key])
                    table.append(
                        {
                            "source": source,
                            "variant": variant,
                            "seed": s,
                            f"source_test_{key}": own,
                            f"dev_{key}": sub.metrics["dev"][key],
                            f"test_{key}": sub.metrics["test"][key],
                            "epochs": sub.metrics.get("epochs"),
                            "trained_now": sub.trained,
                        }
                    )
                summary[f"{source}/{variant}"] = sum(scores) / len(scores)
        published = PUBLISHED if run.task.task_type == "tagging" else {}
        meta: dict[str, Any] = {
            "notes": [
                "each probe is scored on the whole test split with the source's attention on the test instances "
                "(the --split/--limit options do not apply)",
                "saved attention = the fixed source model's distributions on the same batch, every layer",
                f"adversaries: global-adversary sub-runs with seed {seed}, init {resolve_init(run, options.adversary_init)}",
            ],
            "published": published,
        }
        if run.task.task_type == "tagging":
            meta["published_base"] = PUBLISHED_TAGGING["base_test_f1"]
        return Result(self.name, summary, [], {"probes": table}, meta)

    def plot(self, result: Result, directory: Path) -> list[Path]:
        from attnaudit.plotting import pyplot

        plt = pyplot()
        import numpy as np

        key = result.summary["metric"]
        rows = result.tables["probes"]
        sources = list(dict.fromkeys(r["source"] for r in rows))
        variants = list(dict.fromkeys(r["variant"] for r in rows))
        fig, ax = plt.subplots(figsize=(1.6 + 1.5 * len(sources), 3.4), layout="constrained")
        width = 0.8 / len(variants)
        for j, variant in enumerate(variants):
            values = [result.summary.get(f"{s}/{variant}", np.nan) for s in sources]
            ax.bar(np.arange(len(sources)) + j * width, values, width, label=f"probe: {variant}")
        own = [next(r[f"source_test_{key}"] for r in rows if r["source"] == s) for s in sources]
        ax.scatter(np.arange(len(sources)) + 0.4 - width / 2, own, color="black", marker="_", s=300, label="source model", zorder=3)
        ax.set_xticks(np.arange(len(sources)) + 0.4 - width / 2, sources)
        ax.set_ylabel(f"test {key}")
        ax.set_ylim(0.0, 1.0)
        ax.legend(fontsize=8)
        ax.set_title("attention probes")
        return save_figure(fig, directory, "probe_scores")

    def verdict(self, result: Result) -> list[dict[str, Any]]:
        published = result.meta.get("published", {})
        rows = []
        for name, value in result.summary.items():
            if "/" not in name:
                continue
            rows.append(
                {
                    "statistic": name,
                    "value": value,
                    "published": published.get(name, ""),
                    "interpretation": "a high probe score means these attention distributions alone carry the task information "
                    "(adversarial attention that still probes well was not emptied of it)",
                }
            )
        return rows
