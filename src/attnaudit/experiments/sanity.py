"""Sanity checks for explanations (Adebayo et al. 2018): does an explanation change when the model does?

* **Model-parameter randomisation.** The model's layers (:mod:`attnaudit.algorithms.randomisation`:
  blocks of parameters ordered by the forward pass, top = output) are re-initialised with seeded draws,
  **cascading** (from the top down, cumulatively) and **independent** (one at a time, the others
  original), on a private copy: the audited model is never changed. Per step and method: Spearman ρ of
  the absolute scores and the top-k intersection with the original explanation, averaged over the
  instances. The **floor** is the same similarity between the explanations of two independently
  randomised models (draws 1 and 2): what "unrelated to the weights" looks like for this method and
  these inputs. A method **passes** when its similarity at full randomisation falls to the floor
  (the 95 % bootstrap interval of the paired difference reaches within ``tolerance`` of 0) and below
  ``1 − tolerance`` (it changed at all); it **fails** otherwise, with the numbers.
* **Random-logit test** (Sixt et al. 2020; Adebayo et al. 2018): the explanation of a seeded random class
  the model did not predict, against the predicted class's. Methods without a class target (those that
  do not need a prediction: attention, rollout, ...) do not apply.
* **Data randomisation** (Adebayo et al. 2018): the same config trained on labels permuted with the
  seed (a checkpointed, resumable sub-run ``subruns/sanity/permuted-labels-seed-<s>``), its explanations
  against the original's. A model that cannot be retrained here (a Hugging Face model) gets a row
  saying why; the rest of the test runs.
* **Efficient MPRT** (Hedström et al. 2023): the relative rise in explanation complexity (discrete
  entropy of the histogram of absolute scores, ``bins`` equal-width bins) from the original to the
  fully randomised model, ``(H_random − H_original) / H_original`` per instance (Quantus' definition),
  and the slope of the mean complexity over the cascading steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from attnaudit.algorithms.randomisation import (
    Block,
    Randomiser,
    discrete_entropy,
    grouped,
    layers_top_down,
    relative_rise,
    spearman_abs,
    topk_intersection,
)
from attnaudit.data.types import Batch, Example
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.eraser_metrics import bootstrap_ci
from attnaudit.experiments.experiment import AuditSettings, Experiment, Result, register
from attnaudit.explain import EXPLANATIONS, Explanation, applying, default_names, item_mask
from attnaudit.models.interface import AttentionModel, evaluation
from attnaudit.plotting import save_figure
from attnaudit.progress import status, track
from attnaudit.run import Run
from attnaudit.training.adversary import Variant, base_seed, subrun_dir, train_variant, trainable_reason

VARIANTS = ("cascading", "independent")
Scores = dict[str, dict[int, np.ndarray]]
"""method -> instance position -> the method's scores over the instance's real items."""
Batches = list[tuple[list[int], Batch]]


def explain_all(
    model: AttentionModel, batches: Batches, methods: dict[str, Explanation], offered: dict[str, Any],
    explained: Sequence[int] | None = None,
) -> Scores:
    """Every method's scores on every instance of ``batches`` for ``model`` as it is now; ``explained``
    (per instance position): explain that class instead of the predicted one."""
    out: Scores = {name: {} for name in methods}
    with evaluation(model):
        for positions, batch in batches:
            if explained is not None:
                target = torch.tensor([explained[p] for p in positions], device=batch.tokens.device)
                batch = replace(batch, explained=target)
            mask = item_mask(model, batch).cpu()
            for name, method in methods.items():
                values = method(model, batch, **offered).detach().cpu().double()
                for b, position in enumerate(positions):
                    out[name][position] = values[b][mask[b]].numpy()
    return out


def similarities(a: dict[int, np.ndarray], b: dict[int, np.ndarray], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per instance (in position order): Spearman ρ of absolute scores and top-``k`` intersection."""
    keys = sorted(a)
    return (
        np.array([spearman_abs(a[i], b[i]) for i in keys], dtype=float),
        np.array([topk_intersection(a[i], b[i], k) for i in keys], dtype=float),
    )


def complexities(scores: dict[int, np.ndarray], bins: int) -> np.ndarray:
    """eMPRT's complexity (discrete entropy of absolute scores) per instance, in position order."""
    return np.array([discrete_entropy(scores[i], bins) for i in sorted(scores)], dtype=float)


def nanmean(values: np.ndarray) -> float:
    """Mean of the finite values; NaN when there are none."""
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else math.nan


def other_classes(predicted: Sequence[int], classes: int, seed: int) -> list[int]:
    """Per instance a class drawn uniformly (seeded by ``(seed, position)``) among those not predicted."""
    out = []
    for position, pred in enumerate(predicted):
        draw = int(np.random.default_rng([seed, position, 17]).integers(classes - 1))
        out.append(draw if draw < pred else draw + 1)
    return out


def verdict(full: np.ndarray, floor: np.ndarray, tolerance: float, seed: int, resamples: int) -> dict[str, Any]:
    """The model-randomisation verdict of one method from the per-instance similarities at full
    randomisation (``full``) and between two random models (``floor``), see the module docstring."""
    paired = np.isfinite(full) & np.isfinite(floor)
    diff = full[paired] - floor[paired]
    mean_full, mean_floor = nanmean(full), nanmean(floor)
    if diff.size == 0:
        return {"verdict": "undetermined", "spearman_full": mean_full, "floor": mean_floor, "difference": math.nan,
                "ci_low": math.nan, "ci_high": math.nan,
                "reason": "no instance with a defined similarity (constant scores or fewer than two items)"}
    low, high = bootstrap_ci(diff, seed, resamples)
    low = float(diff.mean()) if not math.isfinite(low) else low
    high = float(diff.mean()) if not math.isfinite(high) else high
    changed = mean_full <= 1.0 - tolerance
    near = low <= tolerance
    if changed and near:
        reason = f"similarity falls to the random-model floor (difference {diff.mean():.3f}, 95% CI {low:.3f} to {high:.3f})"
    elif not changed:
        reason = (f"the explanation barely changes when every layer is re-drawn (Spearman {mean_full:.3f} > "
                  f"{1 - tolerance:.2f}; two random models agree at {mean_floor:.3f})")
    else:
        reason = (f"similarity at full randomisation {mean_full:.3f} stays above the floor {mean_floor:.3f} "
                  f"(difference 95% CI {low:.3f} to {high:.3f}, above the tolerance {tolerance:g})")
    return {"verdict": "passes" if changed and near else "fails", "spearman_full": mean_full, "floor": mean_floor,
            "difference": float(diff.mean()), "ci_low": low, "ci_high": high, "reason": reason}


def permuted_labels(run: Run, seed: int) -> Run:
    """``run`` whose train and dev labels are permuted (seeded; the test split is kept): the
    data-randomisation model trains on it."""
    data = run.data()
    rng = np.random.default_rng([seed, 4099])

    def permute(examples: list[Example]) -> list[Example]:
        order = rng.permutation(len(examples))
        return [replace(example, label=examples[j].label) for example, j in zip(examples, order)]

    return replace(run, _data=replace(data, train=permute(data.train), dev=permute(data.dev)))


@register
class Sanity(Experiment):
    """Model-parameter randomisation, random-logit and data randomisation checks of every explanation."""

    name = "sanity"
    description = (
        "sanity checks: explanations under cascading / independent weight randomisation vs a random-model floor, "
        "random-logit and permuted-label models, eMPRT complexity rise"
    )
    paper = "Adebayo et al. 2018; Sixt et al. 2020; Hedström et al. 2023"
    examples = (
        "runs/syn --methods attention,gradient,random --limit 20 --epochs 1",
        "runs/minilm-sst2 --methods attention,gradient --variants cascading --limit 8 --data-dir ../shared/data",
    )
    settings = AuditSettings(
        rank=58,
        options={"epochs": 3, "variants": ["cascading"]},  # an audit: Adebayo's main variant, a short permuted-label run
        decoder_options={"methods": ["attention", "gradient"], "group": 4},  # a 30-layer decoder: the two cheapest methods, 4 layers a step
    )

    @dataclass
    class Options:
        methods: list[str] = field(
            default_factory=list,
            metadata={"help": "Explanations to check (`attnaudit explanations RUN`); default: every default one that applies."},
        )
        variants: list[str] = field(
            default_factory=lambda: list(VARIANTS),
            metadata={"help": "Randomisation orders: cascading (top layer down, cumulative), independent (one layer at a time)."},
        )
        group: int = field(
            default=1, metadata={"help": "Layers randomised together per step (consecutive, top down): fewer steps for a deep model."}
        )
        topk: int = field(default=5, metadata={"help": "k of the top-k intersection."})
        tolerance: float = field(
            default=0.1, metadata={"help": "How close to the random-model floor (in Spearman ρ) the similarity must fall to pass."}
        )
        bins: int = field(default=10, metadata={"help": "Histogram bins of eMPRT's discrete entropy (Quantus' default is 100, for images)."})
        resamples: int = field(default=1000, metadata={"help": "Bootstrap resamples of the verdict's interval."})
        no_random_logit: bool = field(default=False, metadata={"help": "Leave out the random-logit test."})
        no_data_randomisation: bool = field(
            default=False, metadata={"help": "Leave out data randomisation (training the permuted-label model, native families)."}
        )
        epochs: int | None = field(default=None, metadata={"help": "Epochs of the permuted-label model (default: the base run's)."})
        ig_steps: int = field(default=20, metadata={"help": "Integration steps for ig."})
        batch_size: int = field(default=16, metadata={"help": "Instances per batch."})

    def applies(self, run: Run) -> str | None:
        if run.task.task_type not in ("classification", "pair"):
            return f"explanations score one decision per instance; a {run.task.task_type} model makes one per token"
        return None

    @classmethod
    def explanation_choices(cls) -> list[str]:
        return list(EXPLANATIONS)

    def _check(self, run: Run, options: Any) -> tuple[dict[str, Explanation], dict[str, str]]:
        """Every option checked (one-line errors) before any work; the methods to check and those left out."""
        checks: list[tuple[bool, str]] = [
            (options.topk >= 1, f"--topk must be at least 1, got {options.topk}"),
            (options.group >= 1, f"--group must be at least 1, got {options.group}"),
            (0.0 <= options.tolerance < 1.0, f"--tolerance must be in [0, 1), got {options.tolerance}"),
            (options.bins >= 2, f"--bins must be at least 2, got {options.bins}"),
            (options.resamples >= 100, f"--resamples must be at least 100, got {options.resamples}"),
            (options.ig_steps >= 1, f"--ig-steps must be at least 1, got {options.ig_steps}"),
            (options.batch_size >= 1, f"--batch-size must be at least 1, got {options.batch_size}"),
            (options.epochs is None or options.epochs >= 1, f"--epochs must be at least 1, got {options.epochs}"),
            (bool(options.variants), f"--variants: choose from {', '.join(VARIANTS)}"),
        ]
        strays = [v for v in options.variants if v not in VARIANTS]
        checks.append((not strays, f"--variants: unknown variant {strays[0]!r}; choose from {', '.join(VARIANTS)}" if strays else ""))
        for ok, message in checks:
            if not ok:
                raise AttnAuditError(message)
        names = options.methods or default_names()
        return applying(names, run.model, "--methods", default_names())

    def run(self, run: Run, examples: list[Example], options: Any, seed: int = 0) -> Result:
        methods, dropped = self._check(run, options)
        offered = {"steps": options.ig_steps, "seed": seed}
        batches: Batches = list(run.sorted_batches(examples, options.batch_size))
        with evaluation(run.model):
            found, uncalled = layers_top_down(run.model, lambda: run.model(batches[0][1]))
        blocks = grouped(found, options.group)
        if not blocks:
            raise AttnAuditError("the model has no parameters to randomise")
        rand = Randomiser(run.model, blocks, seed)
        work = cast(AttentionModel, rand.model)

        def explain(label: str, explained: Sequence[int] | None = None) -> Scores:
            status(f"sanity: {label}")
            return explain_all(work, batches, methods, offered, explained)

        rand.state({})
        original = explain("original model")
        predicted = self._predictions(work, batches, len(examples))
        layers, steps = self._randomisations(rand, explain, original, options)
        full = steps.get(("cascading", len(blocks)))
        if full is None:
            rand.full(1)
            full = explain("fully randomised model")
        rand.full(2)
        second = explain("second random model (floor)")
        rand.state({})
        logit = None
        if not options.no_random_logit and len(run.labels) > 1:
            others = other_classes(predicted, len(run.labels), seed)
            logit = (others, explain("random other class", others))
        rand.release()
        data = self._data_randomisation(run, batches, methods, offered, options, seed)
        parts = _Parts(original, full, second, logit, data, steps, dict(rand.how))
        return self._result(run, examples, predicted, blocks, uncalled, methods, dropped, layers, parts, options, seed)

    @staticmethod
    def _predictions(model: AttentionModel, batches: Batches, n: int) -> list[int]:
        """The original model's predicted class per instance position."""
        predicted = [0] * n
        with evaluation(model), torch.no_grad():
            for positions, batch in batches:
                for position, pred in zip(positions, model(batch).logits.argmax(-1).tolist()):
                    predicted[position] = int(pred)
        return predicted

    @staticmethod
    def _randomisations(
        rand: Randomiser, explain: Callable[..., Scores], original: Scores, options: Any
    ) -> tuple[list[dict[str, Any]], dict[tuple[str, int], Scores]]:
        """Per variant, step and method the mean similarity to the original (and, cascading, the mean
        complexity), with step 0 the original; and the explanations of every step."""
        rows: list[dict[str, Any]] = []
        steps: dict[tuple[str, int], Scores] = {}
        for variant in options.variants:
            for method, values in original.items():  # step 0: the original against itself (1 where defined)
                rho, top = similarities(values, values, options.topk)
                rows.append({"variant": variant, "step": 0, "block": "(none: original)", "method": method,
                             "spearman": nanmean(rho), "topk": nanmean(top), "n": int(np.isfinite(rho).sum()),
                             "complexity": nanmean(complexities(values, options.bins))})
            walk = rand.cascading(1) if variant == "cascading" else rand.independent(1)
            for step, block, _params in track(walk, f"sanity {variant}", total=len(rand.blocks)):
                scores = explain(f"{variant} step {step}/{len(rand.blocks)} ({block.name})")
                steps[(variant, step)] = scores
                for method, values in scores.items():
                    rho, top = similarities(original[method], values, options.topk)
                    rows.append({"variant": variant, "step": step, "block": block.name, "method": method,
                                 "spearman": nanmean(rho), "topk": nanmean(top), "n": int(np.isfinite(rho).sum()),
                                 "complexity": nanmean(complexities(values, options.bins))})
        return rows, steps

    @staticmethod
    def _data_randomisation(
        run: Run, batches: Batches, methods: dict[str, Explanation], offered: dict[str, Any], options: Any, seed: int
    ) -> dict[str, Any]:
        """The permuted-label model's explanations and scores, or why there is none."""
        if options.no_data_randomisation:
            return {"status": "not run (--no-data-randomisation)"}
        reason = trainable_reason(run)
        if reason:
            return {"status": f"not run: {reason}"}
        status("sanity: training the permuted-label model")
        variant = Variant(key={"kind": "permuted_labels", "seed": seed})
        out = subrun_dir(run, "sanity", f"permuted-labels-seed-{seed}")
        sub = train_variant(permuted_labels(run, seed), out, variant, epochs=options.epochs, seed=base_seed(run),
                            label="permuted labels")
        scores = explain_all(sub.model, batches, methods, offered)
        return {"status": "trained" if sub.trained else "loaded", "scores": scores, "metrics": sub.metrics, "path": str(sub.run.path)}

    def _result(
        self, run: Run, examples: list[Example], predicted: list[int], blocks: list[Block], uncalled: list[str],
        methods: dict[str, Explanation], dropped: dict[str, str], layers: list[dict[str, Any]], parts: _Parts,
        options: Any, seed: int,
    ) -> Result:
        instances = [
            {"index": i, "source": ex.meta.get("source", ""), "length": len(ex.tokens), "label": ex.label,
             "pred": run.labels[predicted[i]]}
            for i, ex in enumerate(examples)
        ]
        summary: dict[str, Any] = {"n": len(examples), "layers": len(blocks)}
        rows = [self._method(name, method, parts, instances, options, seed) for name, method in methods.items()]
        for row in rows:
            summary.update({f"{row['method']}_{key}": row[key] for key in
                            ("verdict", "spearman_full", "floor", "emprt_rise", "random_logit_spearman", "data_spearman")})
        summary["passes"] = sum(row["verdict"] == "passes" for row in rows)
        summary["data_randomisation"] = parts.data["status"]
        tables = {
            "methods": rows,
            "layers": layers,
            "blocks": [
                {"order": i, "block": b.name, "modules": ", ".join(b.modules),
                 "drawn_by": ", ".join(f"{m}: {parts.drawn.get(m, 'not drawn')}" for m in b.modules)}
                for i, b in enumerate(blocks, 1)
            ],
        }
        if "metrics" in parts.data:
            key = next(iter(parts.data["metrics"]["test"]))
            summary[f"data_randomisation_test_{key}"] = parts.data["metrics"]["test"][key]
        notes = self._notes(run, blocks, uncalled, dropped, parts, options)
        meta = {"notes": notes, "csv_tables": ["layers", "methods"], "tolerance": options.tolerance}
        return Result(self.name, summary, instances, tables, meta)

    @staticmethod
    def _method(
        name: str, method: Explanation, parts: _Parts, instances: list[dict[str, Any]], options: Any, seed: int
    ) -> dict[str, Any]:
        """One method's verdict row, with its per-instance columns added to ``instances``."""
        rho_full, top_full = similarities(parts.original[name], parts.full[name], options.topk)
        rho_floor, top_floor = similarities(parts.full[name], parts.second[name], options.topk)
        before = complexities(parts.original[name], options.bins)
        after = complexities(parts.full[name], options.bins)
        rise = np.array([relative_rise(b, a) for b, a in zip(before, after)], dtype=float)
        row = {"method": name, **verdict(rho_full, rho_floor, options.tolerance, seed, options.resamples),
               "topk_full": nanmean(top_full), "topk_floor": nanmean(top_floor), "emprt_rise": nanmean(rise),
               "emprt_slope": _slope(parts.steps, name, parts.original, options.bins)}
        columns = {"spearman_full": rho_full, "topk_full": top_full, "spearman_floor": rho_floor, "emprt_rise": rise}
        row.update(random_logit_spearman=math.nan, random_logit_topk=math.nan, data_spearman=math.nan, data_topk=math.nan)
        if parts.logit is not None and "prediction" in method.needs:
            rho, top = similarities(parts.original[name], parts.logit[1][name], options.topk)
            row.update(random_logit_spearman=nanmean(rho), random_logit_topk=nanmean(top))
            columns["random_logit_spearman"] = rho
        row["random_logit"] = _logit_verdict(parts.logit is not None, method, row["random_logit_spearman"], options.tolerance)
        if "scores" in parts.data:
            rho, top = similarities(parts.original[name], parts.data["scores"][name], options.topk)
            row.update(data_spearman=nanmean(rho), data_topk=nanmean(top))
            columns["data_spearman"] = rho
        for column, values in columns.items():
            for instance, value in zip(instances, values.tolist()):
                instance[f"{column}_{name}"] = value
        return row

    @staticmethod
    def _notes(run: Run, blocks: list[Block], uncalled: list[str], dropped: dict[str, str], parts: _Parts, options: Any) -> list[str]:
        notes = [
            "layers = blocks of parameterised modules (a stack element such as layers.1, else the module), ordered by "
            f"their first call in a forward pass; top-down: {', '.join(b.name for b in blocks)}",
            "randomisation: each module's own reset_parameters() under a seed of (seed, draw, module), else N(0, σ²) with "
            "σ the original's standard deviation; a private copy of the model is randomised, the audited one is unchanged",
            f"similarity: Spearman ρ of absolute scores (scipy.stats.spearmanr), top-{options.topk} intersection; floor: "
            "the same similarity between two independently randomised models (draws 1 and 2)",
            f"eMPRT: (H_random − H_original) / H_original per instance, H the entropy of a {options.bins}-bin histogram "
            "of absolute scores (Quantus discrete_entropy); slope: least-squares slope of the mean H over the cascading steps",
        ]
        if len(run.labels) == 2:
            notes.append("two classes: with probability scores ∂p(other)/∂x = −∂p(ŷ)/∂x, so absolute gradient explanations "
                         "of the other class equal the predicted class's; the random-logit test then says little")
        if uncalled:
            notes.append(f"never called in a forward pass, not randomised: {', '.join(uncalled)}")
        notes += [f"{name} left out: {reason}" for name, reason in dropped.items()]
        notes.append(f"data randomisation: {parts.data['status']}")
        return notes

    def plot(self, result: Result, directory: Path) -> list[Path]:
        from attnaudit.plotting import pyplot

        plt = pyplot()
        rows = result.tables.get("layers", [])
        variants = list(dict.fromkeys(row["variant"] for row in rows))
        if not variants:
            return []
        floors = {row["method"]: row["floor"] for row in result.tables["methods"]}
        fig, axes = plt.subplots(1, len(variants), figsize=(4.8 * len(variants), 3.6), layout="constrained", squeeze=False)
        for ax, variant in zip(axes[0], variants):
            for i, method in enumerate(dict.fromkeys(row["method"] for row in rows)):
                mine = [row for row in rows if row["variant"] == variant and row["method"] == method]
                color = f"C{i % 10}"
                ax.plot([r["step"] for r in mine], [r["spearman"] for r in mine], marker="o", color=color, label=method)
                if math.isfinite(floors.get(method, math.nan)):
                    ax.axhline(floors[method], color=color, linestyle=":", linewidth=1)
            prefix = "+ " if variant == "cascading" else ""
            names = ["original"] + [prefix + block["block"] for block in result.tables["blocks"]]
            ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=7)
            ax.set_ylabel("Spearman ρ with the original explanation")
            ax.set_title(f"{variant}: layers randomised (top down)" if variant == "cascading" else f"{variant}: one layer randomised")
            ax.set_ylim(-1.05, 1.05)
        axes[0][-1].legend(fontsize=7, title="dotted: random-model floor", title_fontsize=7)
        return save_figure(fig, directory, "sanity_layers")

    def verdict(self, result: Result) -> list[dict[str, Any]]:
        return [
            {"statistic": f"{row['method']} (model randomisation)", "value": row["spearman_full"], "published": "",
             "interpretation": f"{row['verdict']}: {row['reason']}"}
            for row in result.tables.get("methods", [])
        ]


@dataclass
class _Parts:
    """The explanations the result is computed from."""

    original: Scores
    full: Scores
    second: Scores
    logit: tuple[list[int], Scores] | None
    data: dict[str, Any]
    steps: dict[tuple[str, int], Scores]
    drawn: dict[str, str]
    """module -> how its random values were drawn (``reset_parameters`` or ``normal``)."""


def _slope(steps: dict[tuple[str, int], Scores], method: str, original: Scores, bins: int) -> float:
    """Least-squares slope of the mean complexity over the cascading steps (0 = original); NaN without them."""
    cascade = sorted(step for variant, step in steps if variant == "cascading")
    if not cascade:
        return math.nan
    x = np.array([0, *cascade], dtype=float)
    y = np.array([nanmean(complexities(original[method], bins))]
                 + [nanmean(complexities(steps[("cascading", s)][method], bins)) for s in cascade])
    keep = np.isfinite(y)
    return float(np.polyfit(x[keep], y[keep], 1)[0]) if keep.sum() >= 2 else math.nan


def _logit_verdict(ran: bool, method: Explanation, spearman: float, tolerance: float) -> str:
    """What the random-logit test says of one method."""
    if "prediction" not in method.needs:
        return "does not apply: the method has no class target"
    if not ran:
        return "not run"
    if not math.isfinite(spearman):
        return "undetermined"
    if spearman <= 1.0 - tolerance:
        return f"class-sensitive (Spearman {spearman:.3f} with the predicted class's explanation)"
    return f"the same explanation for another class (Spearman {spearman:.3f})"
