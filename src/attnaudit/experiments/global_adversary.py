"""Model-consistent adversarial training: a whole new model whose attention differs from the base's.

Unlike the per-instance search of Jain & Wallace (``adversarial``), a new model of the same
architecture is trained end to end (one sub-run per λ, ``RUN/subruns/global-adversary/
lambda-<λ>-seed-<s>``), with the base model fixed and run alongside on every batch:

* **classification** (Wiegreffe & Pinter 2019, §4): loss ``TVD(ŷ_adv, ŷ_base) − λ·KL(α_adv ‖ α_base)``,
  both per-instance and averaged over the batch (KL averaged over heads and query rows),
  λ ∈ {0, 0.001, 0.01, 0.1, 1, 10}. Per λ: mean JSD of the attention and mean TVD of the
  predictions from the base on the tested instances, and the adversary's own test score; the
  figure puts the λ curve, the seed models (``seeds`` test) and the uniform model (``uniform``
  test) on the same JSD-vs-TVD axes (W&P Fig. 5);
* **sequence tagging** (the CoNLL-2000 study): loss ``NLL(ŷ_adv, base's predicted tags) −
  λ·KL(α_base ‖ α_adv)``, KL per real token and head, averaged, λ ∈ {0.2, 0.5, 1, 2, 3}. Per λ:
  chunk F1, mean KL and mean NLL (token-level means over the tested sentences); the point
  where NLL starts to rise steeply is the breakpoint of a continuous two-segment
  piecewise-linear fit of NLL against KL (:func:`breakpoint_fit`).

Both also report each adversary's mean peak attention weight (1 = one-hot rows) and draw one
short test instance's attention under the base and every λ (``global_adversary_attention``).

The attention compared is the base's explained layer (the only one of the RNN family, the
last of a Transformer). The adversary keeps no gold labels: it only has to match the base's
outputs. Its epoch is selected by the lowest dev loss (its own objective). It starts from a
fresh initialisation (``--init scratch``, W&P; the classification default) or from the base
model's weights (``--init base``, the tagging default: fine-tuned away from the base, attention
starts at KL 0, whereas a fresh Transformer's starts nats away, beyond the study's KL scale).
The KL term is unbounded above except by the ``1e-10`` smoothing of :func:`attnaudit.algorithms.metrics.kl`
(at most ≈ 23 nats per row), so an adversary that can afford it drives its attention there.

The tagging KL has two scales (``--kl-scale``): ``token``, the mean KL per real token and head
(the issue's definition, the default), and ``entry``, the mean over every entry of each
sentence's ``heads × n × n`` attention (the token scale divided by the sentence length ``n``),
which is what ``torch.nn.functional.kl_div(..., reduction="mean")`` returns for a sentence. The
study's KL values (breakpoint ≈ 0.33) are consistent with the entry scale: on our CoNLL model the
NLL rises at ≈ 13 nats per token, ≈ 0.33 × the mean sentence length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnaudit.data.types import Example
from attnaudit.experiments.common.measures import weighted_mean
from attnaudit.experiments.common.published import PUBLISHED_TAGGING, compare
from attnaudit.experiments.common.rows import identity_rows
from attnaudit.experiments.experiment import AuditSettings, Experiment, Result, register
from attnaudit.models.interface import (
    AttentionModel,
    evaluation,
)
from attnaudit.plotting import save_figure
from attnaudit.progress import status
from attnaudit.run import Run, load_run
from attnaudit.training.adversary import (
    base_scores,
    check_same_inputs,
    frozen_uniform,
    stored_subruns,
    subrun_dir,
    trainable_reason,
)
from attnaudit.training.attention_adversaries import SUBRUN_TEST, adversary, check_lambdas, resolve_init
from attnaudit.training.checkpoint import METRICS
from attnaudit.training.trainer import InterventionsFn, score_key

NAME = SUBRUN_TEST  # the adversary sub-runs live in this test's folder
DEFAULT_LAMBDAS = {
    "classification": [0.0, 0.001, 0.01, 0.1, 1.0, 10.0],
    "pair": [0.0, 0.001, 0.01, 0.1, 1.0, 10.0],
    "tagging": [0.2, 0.5, 1.0, 2.0, 3.0],
}
PUBLISHED_CLASSIFICATION = {
    "claim": "W&P Fig. 5: adversaries reach higher attention JSD than the seed models only at a cost in "
    "prediction TVD on most data sets; the uniform model is far in JSD and often close in TVD",
}


def entry_scale(kl_per_token: np.ndarray, rows: np.ndarray) -> float:
    """Pooled KL per attention entry from per-sentence KL means per token (and head) and sentence lengths."""
    rows = np.asarray(rows, dtype=float)
    return float((np.asarray(kl_per_token) * rows).sum() / max((rows**2).sum(), 1.0))


def example_attention(run: Run, models: dict[str, AttentionModel], examples: list[Example]) -> dict[str, Any]:
    """The explained layer's attention of every model on one short test instance (the figure's data).

    The first instance of 5–20 items (else the shortest); weights per model as ``(heads, queries,
    keys)`` lists over its real items, so the figure shows where each adversary's attention went.
    """
    example = next((e for e in examples if 5 <= len(e.tokens) <= 20), min(examples, key=lambda e: len(e.tokens)))
    batch = run.collate([example]).to(run.device)  # a batch of one: no padding to cut off
    weights = {}
    for name, model in models.items():
        with evaluation(model), torch.no_grad():
            weights[name] = model(batch).trace[run.model.explained_layer].weights[0].cpu().tolist()
    keys = len(weights["base"][0][0])
    labels = list(example.tokens) if len(example.tokens) == keys else [str(i) for i in range(keys)]
    return {"tokens": labels, "weights": weights}


KL_CEILING = -math.log(1e-10)  # largest KL of one row under metrics.kl's 1e-10 smoothing (nats)
CEILING_SHARE = 0.75
MIN_KL_SPREAD = 0.1  # a breakpoint needs the λ points' KL to span at least this share of the largest


def breakpoint_fit(x: np.ndarray, y: np.ndarray, grid: int = 401) -> dict[str, float]:
    """Continuous two-segment piecewise-linear least-squares fit ``y ≈ a + b·x + c·max(0, x − x₀)``.

    ``x₀`` (the breakpoint) is searched on a grid between the second-smallest and the
    second-largest ``x`` (each segment keeps at least two points), ``a, b, c`` by least squares
    for each candidate. Returns ``breakpoint``, ``slope_before`` (b), ``slope_after`` (b + c) and
    the ``sse``; NaNs when fewer than 4 distinct ``x`` values leave nothing to choose.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    nan = {"breakpoint": float("nan"), "slope_before": float("nan"), "slope_after": float("nan"), "sse": float("nan")}
    if np.unique(x).size < 4:
        return nan
    xs = np.sort(x)
    best = nan
    for x0 in np.linspace(xs[1], xs[-2], grid):
        design = np.stack([np.ones_like(x), x, np.maximum(0.0, x - x0)], 1)
        coef, *_ = np.linalg.lstsq(design, y, rcond=None)
        sse = float(((design @ coef - y) ** 2).sum())
        if not sse >= best["sse"]:  # also true while best["sse"] is NaN
            best = {"breakpoint": float(x0), "slope_before": float(coef[1]), "slope_after": float(coef[1] + coef[2]), "sse": sse}
    return best


def nll_breakpoint(kl: np.ndarray, nll: np.ndarray) -> dict[str, Any]:
    """:func:`breakpoint_fit` of NLL against KL, with ``breakpoint`` NaN when NLL does not rise
    more steeply after it, or when the KL values are ``flat`` (spread < 10% of the largest: every
    λ drove attention equally far, so there is no curve to break)."""
    kl = np.asarray(kl, dtype=float)
    fit: dict[str, Any] = breakpoint_fit(kl, nll)
    spread = float(kl.max() - kl.min()) if kl.size else 0.0
    fit["flat"] = spread < MIN_KL_SPREAD * float(np.abs(kl).max(initial=0.0))
    if fit["flat"] or not fit["slope_after"] > fit["slope_before"]:
        fit["breakpoint"] = float("nan")
    return fit


def finished_subruns(run: Run, test: str) -> list[Path]:
    """Finished sub-run directories of another test (``metrics.json`` present), by name: those
    under the sub-run root, then those only under ``RUN/subruns`` (:func:`stored_subruns`)."""
    found: dict[str, Path] = {}
    for root in stored_subruns(run, subrun_dir(run, test, "")) if run.path or run.subruns else []:
        for d in sorted(root.iterdir()) if root.is_dir() else []:
            if (d / METRICS).exists():
                found.setdefault(d.name, d)
    return [found[name] for name in sorted(found)]


def reference_points(run: Run, examples: list[Example]) -> list[dict[str, Any]]:
    """The seed models and uniform models already trained by the ``seeds`` / ``uniform`` tests,
    compared with the base on the same instances (points of the W&P figure; nothing is trained).
    """
    points = []
    sources: list[tuple[str, str, InterventionsFn | None]] = [("seeds", "seed", None), ("uniform", "uniform", frozen_uniform)]
    for test, kind, interventions in sources:
        for directory in finished_subruns(run, test):
            other = load_run(directory, device=str(run.device))
            check_same_inputs(run, other)
            c = compare(run, other.model, examples, interventions)
            points.append(
                {
                    "kind": kind,
                    "name": directory.name,
                    "mean_jsd": float(np.mean(c["jsd"])),
                    "mean_tvd": float(np.mean(c["tvd"])),
                    "mean_kl": weighted_mean(c["kl_base_other"], c["rows"]),
                    **({"mean_kl_entry": entry_scale(c["kl_base_other"], c["rows"])} if run.task.task_type == "tagging" else {}),
                    "mean_nll": weighted_mean(c["nll"], c["outputs"]),
                }
            )
    return points


def plot_example_attention(example: dict[str, Any], directory: Path) -> list[Path]:
    """One instance's attention, base and every λ: a row of tokens per model for single-query
    attention, else a ``query × key`` map per model (rows) and head (columns)."""
    from attnaudit.plotting import pyplot

    plt = pyplot()

    tokens, weights = example["tokens"], example["weights"]
    names = list(weights)
    arrays = [np.asarray(weights[name]) for name in names]  # (heads, queries, keys) each
    heads, queries = arrays[0].shape[:2]
    size = max(2.0, 0.22 * len(tokens))
    if queries == 1:
        fig, ax = plt.subplots(figsize=(1.5 + size, 0.9 + 0.35 * len(names)), layout="constrained")
        image = ax.imshow(np.stack([a[0, 0] for a in arrays]), cmap="Oranges", vmin=0, vmax=1, aspect="auto")
        ax.set_yticks(range(len(names)), names)
        ax.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=7)
    else:
        fig, axes = plt.subplots(len(names), heads, figsize=(0.6 + size * heads, 0.4 + size * len(names)),
                                 layout="constrained", squeeze=False)
        for r, (name, a) in enumerate(zip(names, arrays)):
            for h in range(heads):
                ax = axes[r][h]
                image = ax.imshow(a[h], cmap="Oranges", vmin=0, vmax=1)
                ax.set_xticks(range(len(tokens)), tokens if r == len(names) - 1 else [], rotation=90, fontsize=6)
                ax.set_yticks(range(len(tokens)), tokens if h == 0 else [], fontsize=6)
                if r == 0:
                    ax.set_title(f"head {h}", fontsize=8)
            axes[r][0].set_ylabel(name, fontsize=9)
    fig.colorbar(image, ax=fig.axes, shrink=0.6, label="attention weight")
    fig.suptitle("one test instance: the base's and each adversary's attention", fontsize=9)
    return save_figure(fig, directory, "global_adversary_attention")


@register
class GlobalAdversary(Experiment):
    """Train adversarial models over a λ sweep; how far can attention move while outputs stay?"""

    name = NAME
    retrains = True
    settings = AuditSettings(
        rank=64,
        options={"epochs": 3},
        demo={"full": {"lambdas": [1.0], "epochs": 2}, "quick": {"lambdas": [0.2], "epochs": 1}},
    )
    description = "train a new model whose attention diverges from the base's while its predictions match (λ sweep)"
    paper = "Wiegreffe & Pinter 2019 §4 (classification); CoNLL-2000 tagging study (NLL − λ·KL)"

    @dataclass
    class Options:
        lambdas: list[float] = field(
            default_factory=list,
            metadata={"help": "λ values (default: 0,0.001,0.01,0.1,1,10 for classification; 0.2,0.5,1,2,3 for tagging)."},
        )
        epochs: int | None = field(default=None, metadata={"help": "Training epochs per adversary (default: the base run's)."})
        init: str = field(
            default="",
            metadata={"help": "Adversary start: scratch (fresh initialisation) or base (the base model's weights); "
                      "default scratch for classification, base for tagging."},
        )
        kl_scale: str = field(
            default="token",
            metadata={"help": "Tagging KL normalisation: token (mean per real token and head) or entry "
                      "(mean over each sentence's heads × n × n attention entries, as kl_div's mean)."},
        )

    def applies(self, run: Run) -> str | None:
        return trainable_reason(run)

    def run(self, run: Run, examples: list[Example], options: Any, seed: int = 0) -> Result:
        task_type = run.task.task_type
        tagging = task_type == "tagging"
        lambdas = list(dict.fromkeys(float(v) for v in (options.lambdas or DEFAULT_LAMBDAS[task_type])))
        check_lambdas(lambdas)
        key = score_key(task_type)
        base = base_scores(run)
        table, columns, models = [], {}, {"base": run.model}
        for n, lam in enumerate(lambdas, 1):
            status(f"global adversary: λ={lam:g} ({n}/{len(lambdas)})")
            sub = adversary(run, lam, seed, options.epochs, options.init, options.kl_scale)
            c = compare(run, sub.model, examples)
            columns[lam] = c
            models[f"λ={lam:g}"] = sub.model
            table.append(_sweep_row(lam, sub.metrics, sub.trained, c, key, tagging))
        instances = identity_rows(run, examples, next(iter(columns.values())))
        for i, row in enumerate(instances):
            for lam, c in columns.items():
                names = (("kl_lambda", "kl_base_other"), ("nll_lambda", "nll")) if tagging else (("jsd_lambda", "jsd"), ("tvd_lambda", "tvd"))
                row.update({f"{prefix}{lam:g}": float(c[column][i]) for prefix, column in names})
        points = reference_points(run, examples)
        first = next(iter(columns.values()))
        summary: dict[str, Any] = {
            "metric": key,
            f"base_test_{key}": base["test"][key],
            "base_mean_max_attention": weighted_mean(first["max_attention"], first["rows"]),
        }
        notes = [
            "attention compared at the base's explained layer; JSD/TVD/KL/NLL are measured on the tested instances, "
            f"{key} on the whole test split",
            f"adversaries start from {'the base model' if resolve_init(run, options.init) == 'base' else 'a fresh initialisation'} "
            f"(seed {seed})",
        ]
        tables: dict[str, list[dict[str, Any]]] = {"lambdas": table, "reference_points": points}
        kl_key = "mean_kl_entry" if options.kl_scale == "entry" else "mean_kl"
        for row in table:
            lam = row["lambda"]
            summary[f"{key}@{lam:g}"] = row[f"test_{key}"]
            if tagging:
                summary[f"kl@{lam:g}"] = row[kl_key]
                summary[f"nll@{lam:g}"] = row["mean_nll"]
            else:
                summary[f"jsd@{lam:g}"] = row["mean_jsd"]
                summary[f"tvd@{lam:g}"] = row["mean_tvd"]
        if tagging:
            _breakpoint(table, options.kl_scale, kl_key, summary, notes)
        published: dict[str, Any] = dict(PUBLISHED_TAGGING if tagging else PUBLISHED_CLASSIFICATION)
        if not points:
            notes.append("no finished seeds/uniform sub-runs: run the seeds and uniform tests first to add their points")
        meta = {"notes": notes, "published": published, "example_attention": example_attention(run, models, examples)}
        return Result(self.name, summary, instances, tables, meta)

    def plot(self, result: Result, directory: Path) -> list[Path]:
        from attnaudit.plotting import pyplot

        plt = pyplot()

        table, points = result.tables["lambdas"], result.tables.get("reference_points", [])
        tagging = "breakpoint_kl" in result.summary
        entry = result.summary.get("kl_scale") == "entry"
        xkey, ykey = ("mean_kl_entry" if entry else "mean_kl", "mean_nll") if tagging else ("mean_jsd", "mean_tvd")
        fig, ax = plt.subplots(figsize=(5.2, 3.9), layout="constrained")
        xs, ys = [r[xkey] for r in table], [r[ykey] for r in table]
        ax.plot(xs, ys, "o-", color="#c44e52", label="adversary (λ)")
        for r, x, y in zip(table, xs, ys):
            ax.annotate(f"{r['lambda']:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        for kind, marker, colour in (("seed", "^", "#4c72b0"), ("uniform", "s", "#55a868")):
            chosen = [p for p in points if p["kind"] == kind]
            if chosen:
                ax.scatter([p[xkey] for p in chosen], [p[ykey] for p in chosen], marker=marker, color=colour, label=kind, zorder=3)
        if tagging and np.isfinite(result.summary.get("breakpoint_kl") or np.nan):
            x0 = result.summary["breakpoint_kl"]
            ax.axvline(x0, color="grey", linestyle="--", label=f"breakpoint KL={x0:.3g}")
        scale = "per attention entry" if entry else "per token and head"
        ax.set_xlabel(f"mean KL(α_base ‖ α_adv) {scale}" if tagging else "mean JSD(α_adv, α_base)")
        ax.set_ylabel("mean NLL of the base's tags" if tagging else "mean TVD(ŷ_adv, ŷ_base)")
        ax.set_title("global adversary: " + ("NLL vs KL" if tagging else "attention vs prediction distance"))
        ax.legend(fontsize=8)
        paths = save_figure(fig, directory, "global_adversary_nll_vs_kl" if tagging else "global_adversary_jsd_vs_tvd")
        key = result.summary["metric"]
        fig, ax = plt.subplots(figsize=(4.6, 3.4), layout="constrained")
        ax.plot([str(f"{r['lambda']:g}") for r in table], [r[f"test_{key}"] for r in table], "o-", color="#c44e52", label="adversary")
        ax.axhline(result.summary[f"base_test_{key}"], color="#4c72b0", linestyle="--", label="base")
        ax.set_xlabel("λ")
        ax.set_ylabel(f"test {key}")
        ax.legend(fontsize=8)
        paths += save_figure(fig, directory, "global_adversary_scores")
        example = result.meta.get("example_attention")
        return paths + (plot_example_attention(example, directory) if example else [])

    def verdict(self, result: Result) -> list[dict[str, Any]]:
        s, table = result.summary, result.tables["lambdas"]
        key = s["metric"]
        published = result.meta.get("published", {})
        if "breakpoint_kl" in s:
            worst = min(table, key=lambda r: r[f"test_{key}"])
            return [
                {
                    "statistic": "breakpoint_kl",
                    "value": s["breakpoint_kl"],
                    "published": published.get("breakpoint_kl", ""),
                    "interpretation": f"attention can move this far (KL {s.get('kl_scale', 'token')} scale) before the adversary's "
                    "predictions start to diverge quickly from the base's",
                },
                {
                    "statistic": f"{key}@{worst['lambda']:g}",
                    "value": worst[f"test_{key}"],
                    "published": published.get(f"{key}@{worst['lambda']:g}", ""),
                    "interpretation": f"lowest adversary {key} (base {s[f'base_test_{key}']:.3f}): pushing attention away "
                    "costs accuracy, so the base's attention is not freely replaceable",
                },
            ]
        seeds = [p for p in result.tables.get("reference_points", []) if p["kind"] == "seed"]
        bound = max((p["mean_tvd"] for p in seeds), default=0.05)
        within = [r for r in table if r["mean_tvd"] <= bound]
        best = max(within, key=lambda r: r["mean_jsd"]) if within else None
        seed_jsd = max((p["mean_jsd"] for p in seeds), default=float("nan"))
        meaning = (
            f"largest attention JSD {best['mean_jsd']:.3f} (λ={best['lambda']:g}) among adversaries whose TVD ≤ {bound:.3f}"
            + (f"; seeds reach JSD {seed_jsd:.3f}" if seeds else " (no seed models yet: bound 0.05)")
            if best
            else f"no adversary keeps mean TVD ≤ {bound:.3f}: different attention costs prediction fidelity"
        )
        return [{"statistic": "max_jsd_at_seed_tvd", "value": best["mean_jsd"] if best else None, "published": "", "interpretation": meaning}]


def _sweep_row(lam: float, metrics: dict[str, Any], trained: bool, c: dict[str, Any], key: str, tagging: bool) -> dict[str, Any]:
    """One λ's row of the sweep table: the adversary's test score and its attention and outputs against the base's."""
    return {
        "lambda": lam,
        f"test_{key}": metrics["test"][key],
        "mean_jsd": float(np.mean(c["jsd"])),
        "mean_tvd": float(np.mean(c["tvd"])),
        # Each objective's own KL direction: KL(adv‖base) for W&P, KL(base‖adv) per token for tagging.
        "mean_kl": weighted_mean(c["kl_base_other"], c["rows"]) if tagging else float(np.mean(c["kl_other_base"])),
        **({"mean_kl_entry": entry_scale(c["kl_base_other"], c["rows"])} if tagging else {}),
        "mean_nll": weighted_mean(c["nll"], c["outputs"]),
        "agreement": weighted_mean(c["agreement"], c["outputs"]),
        # 1.0 = one-hot rows: a saturated adversary parks its attention on one key (base: summary)
        "mean_max_attention": weighted_mean(c["max_attention_other"], c["rows"]),
        "epochs": metrics.get("epochs"),
        "trained_now": trained,
    }


def _breakpoint(table: list[dict[str, Any]], kl_scale: str, kl_key: str, summary: dict[str, Any], notes: list[str]) -> None:
    """Tagging: the NLL-vs-KL breakpoint over the λ points into ``summary``, and what it means into ``notes``."""
    summary["kl_scale"] = kl_scale
    fit = nll_breakpoint(np.array([r[kl_key] for r in table]), np.array([r["mean_nll"] for r in table]))
    summary["breakpoint_kl"] = fit["breakpoint"]
    if fit["flat"]:
        notes.append("KL barely varies across the λ points (spread under 10% of the largest): no breakpoint is fitted")
    summary["nll_slope_before"] = fit["slope_before"]
    summary["nll_slope_after"] = fit["slope_after"]
    notes.append(
        "breakpoint: continuous two-segment piecewise-linear least-squares fit of mean NLL against mean KL over "
        f"the λ points ({kl_scale}-scale KL), breakpoint searched on a grid between the 2nd-smallest and "
        "2nd-largest KL (needs ≥ 4 distinct KL values); NaN when NLL does not rise more steeply after it"
    )
    if max(r["mean_kl"] for r in table) > CEILING_SHARE * KL_CEILING:
        notes.append(
            f"mean KL reaches {max(r['mean_kl'] for r in table):.1f} nats, near the {KL_CEILING:.1f}-nat ceiling of "
            "the 1e-10-smoothed KL: the adversary's attention leaves the base's support, and λ in this range no "
            "longer controls how far it moves; smaller λ values trace the rise"
        )
