"""The faithfulness scoreboard: ERASER's metrics for every registered explanation method.

Every explanation method of :mod:`attnaudit.explain` that applies to the model (or those given
with ``--methods``) is scored per instance by comprehensiveness and sufficiency at each bin
and their AOPC (DeYoung et al. 2020), by the areas under the deletion and insertion curves,
against the known rationale where the task has one (AUPRC, token F1 of the top-k words), and
against each other (mean Kendall τ, top-k overlap). The metrics and the batched perturbations
are in :mod:`attnaudit.experiments.eraser_metrics`. Each headline number comes with a seeded 95 % percentile
bootstrap interval over instances; the per-instance values are in the CSV.

Outputs: ``faithfulness.json`` (everything), ``faithfulness.csv`` (per instance),
``faithfulness_scoreboard.csv`` (methods × metrics, ranked, with intervals),
``faithfulness_agreement.csv``, and the figures ``faithfulness_aopc``, ``faithfulness_curves``
and ``faithfulness_agreement``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from attnaudit.algorithms.metrics import score_against
from attnaudit.data.types import Batch, Example
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.common.passes import prepare
from attnaudit.experiments.common.units import instance_units
from attnaudit.experiments.eraser_metrics import (
    BINS,
    MODES,
    agreement,
    decisions,
    describe,
    filler,
    perturbation_probs,
    removable_items,
    token_f1,
    top_units,
)
from attnaudit.experiments.experiment import AuditSettings, Experiment, Result, register
from attnaudit.explain import EXPLANATIONS, choose, list_explanations
from attnaudit.explain.registry import per_segment
from attnaudit.models.interface import evaluation
from attnaudit.plotting import save_figure
from attnaudit.progress import track
from attnaudit.run import Run

METRICS = ("aopc_comp", "aopc_suff", "deletion", "insertion")
HIGHER_BETTER = {"aopc_comp": True, "aopc_suff": False, "deletion": False, "insertion": True, "auprc": True, "token_f1": True}
PUBLISHED = {
    "alti_sst2_roberta": (
        "ALTI repository, SST-2 RoBERTa, comprehensiveness / sufficiency: ALTI .269/.057, IG .223/.074, "
        "gradient .190/.075, norm-rollout .168/.135, GlobEnc .161/.119, rollout .076/.179"
    ),
    "decompx_sst2_bert": (
        "DecompX (Modarressi et al. 2023) Table 1, SST-2 BERT-base, AOPC with [MASK]: DecompX .627, ALTI .416, "
        "IG .340, gradient×input .310, GlobEnc .307"
    ),
    "eraser": "DeYoung et al. 2020 (ERASER): comprehensiveness and sufficiency, AOPC over bins 1, 5, 10, 20, 50 %",
}


@dataclass
class Collected:
    """Everything gathered over the batches, per evaluated instance (``n ≥ 2`` removable items)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    removed: dict[str, list[np.ndarray]] = field(default_factory=dict)  # mode -> per batch (M, F, B)
    kept: dict[str, list[np.ndarray]] = field(default_factory=dict)
    full: list[np.ndarray] = field(default_factory=list)
    plausible: list[tuple[np.ndarray, dict[str, np.ndarray]]] = field(default_factory=list)
    pairs: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict)
    unaligned: int = 0


def in_order(c: Collected) -> Collected:
    """``c`` with its instances sorted by their index in the examples (they were batched by length)."""
    perm = np.argsort([row["index"] for row in c.rows], kind="stable")
    if not len(perm):
        return c
    flat = np.concatenate(c.full)[perm]

    def sort(parts: list[np.ndarray]) -> list[np.ndarray]:
        return [np.concatenate(parts, -1)[..., perm]]

    return Collected(
        rows=[c.rows[i] for i in perm], removed={m: sort(v) for m, v in c.removed.items()},
        kept={m: sort(v) for m, v in c.kept.items()}, full=[flat], plausible=[c.plausible[i] for i in perm],
        pairs=c.pairs, unaligned=c.unaligned,
    )


def grid(bins: list[float], steps: int) -> list[float]:
    """The percents to perturb at: the bins and the curve grid ``100·i/steps`` for ``0 < i < steps``."""
    curve = [100.0 * i / steps for i in range(1, steps)] if steps > 1 else []
    return sorted({round(p, 9) for p in [*bins, *curve]})


@register
class Faithfulness(Experiment):
    """The test of this module (its docstring gives the metrics and the outputs)."""

    name = "faithfulness"
    settings = AuditSettings(
        rank=8,
        decoder_options={
        "methods": ["attention", "gradient", "random"], "mode": "delete", "bins": [20.0, 50.0], "curve_steps": 0, "batch_size": 8,
    },
        demo={
        "full": {"ig_steps": 10, "mode": "delete"},
        "quick": {"methods": ["attention", "gradient", "random"], "mode": "delete", "curve_steps": 0, "resamples": 100},
    },
    )
    # An LLM: every method and both modes held ~20 GB and ran >15 min on 20 SST-2 sentences (SmolLM2-135M);
    # the audit scores attention and gradient against random by deletion at two bins, 8 sentences a batch
    # (the importance and rollout tests' batches: their gradients are reused, see explain.registry.memoised;
    # each batch's perturbations run in passes of bounded size, ~1 GB).
    description = (
        "ERASER scoreboard of every explanation (`attnaudit explanations`): comprehensiveness and sufficiency "
        "(AOPC over bins), deletion/insertion curves, plausibility against known rationales, agreement between "
        "methods; bootstrap 95% intervals"
    )
    paper = "DeYoung et al. 2020 (ERASER)"
    examples = (
        "runs/sst --limit 200 --data-dir ../shared/data",
        "runs/syn --methods attention,gradient,loo,random --mode delete --bins 10,20,50 --limit 100",
    )

    @dataclass
    class Options:
        methods: list[str] = field(
            default_factory=list,
            metadata={"help": "Explanations to score (`attnaudit explanations RUN`); default: every registered one that applies."},
        )
        bins: list[float] = field(
            default_factory=lambda: list(BINS),
            metadata={"help": "AOPC bins: percent of the removable items (k = ceil(f*n), at least 1, at most n-1)."},
        )
        mode: str = field(
            default="both",
            metadata={"help": "Removal: delete (remove the items), mask ([MASK] for HF encoders, <unk> for attnaudit models) or both."},
        )
        curve_steps: int = field(default=10, metadata={"help": "Deletion/insertion curve grid: 100*i/steps percent, 0 < i < steps (0: none)."})
        topk: float = field(default=20.0, metadata={"help": "Agreement: top-k overlap with k = ceil(topk% of the items)."})
        ig_steps: int = field(default=20, metadata={"help": "Integrated Gradients steps."})
        resamples: int = field(default=1000, metadata={"help": "Bootstrap resamples for the 95% intervals."})
        batch_size: int = field(default=32, metadata={"help": "Instances per batch."})

    @classmethod
    def explanation_choices(cls) -> list[str]:
        """Every registered explanation."""
        return list(EXPLANATIONS)

    def applies(self, run: Run) -> str | None:
        if run.task.task_type not in ("classification", "pair"):
            return f"a {run.task.task_type} model makes one decision per token; the scoreboard perturbs one decision per instance"
        if not list_explanations(run):
            return "no registered explanation method applies to this model"
        return None

    def run(self, run: Run, examples: list[Example], options: Any, seed: int = 0) -> Result:
        methods, modes, percents = self._check(run, options)
        collected = Collected(removed={m: [] for m in modes}, kept={m: [] for m in modes})
        # Batches of similar length, so the quadratic methods pad little; put back in order below.
        total = -(-len(examples) // options.batch_size)
        for indices, batch in track(run.sorted_batches(examples, options.batch_size), "faithfulness", total=total):
            self._batch(run, batch, methods, modes, percents, options, seed, indices, collected)
        return self._result(run, in_order(collected), methods, modes, percents, options, seed, len(examples))

    def _check(self, run: Run, options: Any) -> tuple[list[str], list[str], list[float]]:
        """The methods, modes and percents to run; one-line errors for impossible options."""
        if options.methods:
            methods = list(choose(options.methods, self.explanation_choices(), model=run.model))
        else:
            methods = [m.name for m in list_explanations(run)]
        if options.mode not in (*MODES, "both"):
            raise AttnAuditError(f"--mode must be delete, mask or both, got {options.mode!r}")
        bad = [b for b in options.bins if not 0 < b < 100]
        if bad or not options.bins:
            raise AttnAuditError(f"--bins must be percents strictly between 0 and 100, got {', '.join(map(str, bad or options.bins))}")
        for name, value, low in (("--curve-steps", options.curve_steps, 0), ("--ig-steps", options.ig_steps, 1),
                                 ("--resamples", options.resamples, 10), ("--batch-size", options.batch_size, 1)):
            if value < low:
                raise AttnAuditError(f"{name} must be at least {low}, got {value}")
        if not 0 < options.topk <= 100:
            raise AttnAuditError(f"--topk must be a percent in (0, 100], got {options.topk}")
        modes = list(MODES) if options.mode == "both" else [options.mode]
        return methods, modes, grid(list(options.bins), options.curve_steps)

    def _batch(
        self, run: Run, batch: Batch, methods: list[str], modes: list[str], percents: list[float],
        options: Any, seed: int, indices: list[int], collected: Collected,
    ) -> None:
        """Explain one batch with every method, perturb it in every mode, and collect per-instance values."""
        model = run.model
        with evaluation(model):  # the decisions, and the attention read from the same (shared) pass
            prepared = prepare(model, batch, [model.explained_layer % model.num_attention_layers])
        pred, full = decisions(prepared.probs)
        scores: dict[str, Tensor] = {}
        for m in methods:
            if m == "attention":
                assert prepared.attention is not None  # prepare() reads it when the explained layer is the only one
                score = per_segment(model, batch, prepared.attention)  # summed per segment, as the registry's methods
            else:
                score = EXPLANATIONS[m](model, batch, steps=options.ig_steps, seed=seed)
            scores[m] = score.detach().double().cpu()
        removable = removable_items(model, batch).cpu()
        n = removable.sum(1)
        keep = (n >= 2).numpy()
        for mode in modes:
            removed, kept = perturbation_probs(model, batch, scores, percents, mode, pred)  # type: ignore[arg-type]
            collected.removed[mode].append(removed.numpy()[:, :, keep])
            collected.kept[mode].append(kept.numpy()[:, :, keep])
        collected.full.append(full.numpy()[keep])
        for b in np.flatnonzero(keep):
            example = batch.examples[b]
            collected.rows.append(
                {"index": indices[int(b)], "source": example.meta.get("source", ""), "label": example.label,
                 "pred": run.labels[int(pred[b])], "items": int(n[b]), "p_pred": float(full[b])}
            )
            vectors = {m: s[b][removable[b]].numpy() for m, s in scores.items()}
            k = max(1, min(int(n[b]), math.ceil(round(options.topk / 100 * int(n[b]), 9))))
            for pair, values in agreement(vectors, k).items():
                collected.pairs.setdefault(pair, []).append(values)
            self._plausibility(run, batch, int(b), scores, collected)

    @staticmethod
    def _plausibility(run: Run, batch: Batch, b: int, scores: dict[str, Tensor], collected: Collected) -> None:
        """Unit scores of every method for instance ``b`` when it carries a rationale (kept for AUPRC and F1)."""
        if not batch.examples[b].rationale:
            collected.plausible.append((np.zeros(0, dtype=bool), {}))
            return
        units = instance_units(run, batch, b)
        if units is None or not units.positive.any():
            collected.unaligned += 1
            collected.plausible.append((np.zeros(0, dtype=bool), {}))
            return
        collected.plausible.append((units.positive, {m: units.scores(s[b].numpy()) for m, s in scores.items()}))

    def _result(
        self, run: Run, c: Collected, methods: list[str], modes: list[str], percents: list[float],
        options: Any, seed: int, total: int,
    ) -> Result:
        bins = [percents.index(round(b, 9)) for b in sorted(set(options.bins))]
        curve = [i for i, p in enumerate(percents) if options.curve_steps > 1 and round(p * options.curve_steps / 100, 9).is_integer()]
        full = np.concatenate(c.full) if c.full else np.zeros(0)
        per_instance: dict[tuple[str, str, str], np.ndarray] = {}
        bin_rows, curve_rows = [], []
        for mode in modes:
            removed = np.concatenate(c.removed[mode], -1) if c.full else np.zeros((len(methods), len(percents), 0))
            kept = np.concatenate(c.kept[mode], -1) if c.full else removed
            comp, suff = full - removed, full - kept  # (M, F, N)
            for j, m in enumerate(methods):
                per_instance[(m, mode, "aopc_comp")] = comp[j, bins].mean(0)
                per_instance[(m, mode, "aopc_suff")] = suff[j, bins].mean(0)
                per_instance[(m, mode, "deletion")] = removed[j, curve].mean(0) if curve else np.full(full.size, np.nan)
                per_instance[(m, mode, "insertion")] = kept[j, curve].mean(0) if curve else np.full(full.size, np.nan)
                for i in bins:
                    bin_rows.append({"mode": mode, "method": m, "percent": percents[i],
                                     **_prefixed("comprehensiveness", describe(comp[j, i], seed, options.resamples)),
                                     **_prefixed("sufficiency", describe(suff[j, i], seed, options.resamples))})
                    for key, values in (("comp", comp), ("suff", suff)):
                        for row, value in zip(c.rows, values[j, i]):
                            row[f"{m}_{mode}_{key}@{percents[i]:g}"] = float(value)
                for i in curve:
                    curve_rows.append({"mode": mode, "method": m, "percent": percents[i],
                                       "deletion": float(np.nanmean(removed[j, i])) if full.size else math.nan,
                                       "insertion": float(np.nanmean(kept[j, i])) if full.size else math.nan})
        plausibility = self._plausibility_scores(c, methods)
        for row_index, row in enumerate(c.rows):
            for (m, mode, metric), values in per_instance.items():
                row[f"{m}_{mode}_{metric}"] = float(values[row_index])
            for (m, metric), values in plausibility.items():
                row[f"{m}_{metric}"] = float(values[row_index])
        board = self._scoreboard(per_instance, plausibility, methods, modes, seed, options.resamples)
        return self._assemble(run, c, board, bin_rows, curve_rows, methods, modes, options, total)

    @staticmethod
    def _plausibility_scores(c: Collected, methods: list[str]) -> dict[tuple[str, str], np.ndarray]:
        """Per instance AUPRC and token F1 of the top-k units (k = mean rationale size, ERASER's convention)."""
        sizes = [int(p.sum()) for p, _ in c.plausible if p.size]
        if not sizes:
            return {}
        k = max(1, round(float(np.mean(sizes))))
        out = {(m, metric): np.full(len(c.plausible), np.nan) for m in methods for metric in ("auprc", "token_f1")}
        for i, (positive, unit_scores) in enumerate(c.plausible):
            for m, values in unit_scores.items():
                out[(m, "auprc")][i] = score_against(values, positive)["ap"]
                out[(m, "token_f1")][i] = token_f1(top_units(values, k), positive) if np.isfinite(values).all() else np.nan
        return out

    @staticmethod
    def _scoreboard(
        per_instance: dict[tuple[str, str, str], np.ndarray], plausibility: dict[tuple[str, str], np.ndarray],
        methods: list[str], modes: list[str], seed: int, resamples: int,
    ) -> list[dict[str, Any]]:
        """One row per (mode, method) with every metric's mean and 95 % interval, ranked by AOPC comprehensiveness."""
        board = []
        shared = {(m, metric): describe(v, seed, resamples) for (m, metric), v in plausibility.items()}
        for mode in modes:
            rows = []
            for m in methods:
                row: dict[str, Any] = {"mode": mode, "method": m}
                for metric in METRICS:
                    stats = describe(per_instance[(m, mode, metric)], seed, resamples)
                    row.update({metric: stats["mean"], f"{metric}_low": stats["ci_low"], f"{metric}_high": stats["ci_high"]})
                    row["n"] = stats["n"]
                for metric in ("auprc", "token_f1"):
                    if (m, metric) in shared:
                        s = shared[(m, metric)]
                        row.update({metric: s["mean"], f"{metric}_low": s["ci_low"], f"{metric}_high": s["ci_high"]})
                rows.append(row)
            for metric in (*METRICS, "auprc", "token_f1"):
                _rank(rows, metric)
            rows.sort(key=lambda r: r.get("rank_aopc_comp", len(rows) + 1))
            board += rows
        return board

    def _assemble(
        self, run: Run, c: Collected, board: list[dict[str, Any]], bin_rows: list[dict[str, Any]],
        curve_rows: list[dict[str, Any]], methods: list[str], modes: list[str], options: Any, total: int,
    ) -> Result:
        """The Result: summary, tables, notes and what the published scoreboards say."""
        agreement_rows = [
            {"a": a, "b": b, "tau": _nanmean([v[0] for v in values]), "overlap": _nanmean([v[1] for v in values]), "n": len(values)}
            for (a, b), values in c.pairs.items()
        ]
        summary: dict[str, Any] = {"n": len(c.rows), "excluded_short": total - len(c.rows), "methods": len(methods)}
        for mode in modes:
            rows = [r for r in board if r["mode"] == mode]
            for metric in METRICS:
                best = [r for r in rows if r.get(f"rank_{metric}") == 1]
                summary[f"best_{metric}_{mode}"] = best[0]["method"] if best else ""
            for r in rows:
                for metric in ("aopc_comp", "aopc_suff"):
                    summary[f"{r['method']}_{mode}_{metric}"] = r[metric]
                    summary[f"{r['method']}_{mode}_{metric}_ci"] = [r[f"{metric}_low"], r[f"{metric}_high"]]
        for r in board[: len(methods)]:
            if "auprc" in r:
                summary[f"{r['method']}_auprc"] = r["auprc"]
        fill = filler(run.model)[1]
        notes = [
            "comprehensiveness = p(ŷ|x) − p(ŷ|x without the top-k items); sufficiency = p(ŷ|x) − p(ŷ|only the top-k "
            f"items); ŷ = the model's prediction on the unperturbed input; AOPC = mean over the bins {sorted(set(options.bins))} %",
            "k = ceil(f·n) of the n removable items, at least 1 and at most n−1; items ranked by the method's score as "
            "given (signed methods: most supporting first), ties by position; special tokens ([CLS], [SEP]) are never removed",
            f"modes: delete removes the items (later ones move up); mask replaces each token of a removed item by {fill}",
            "deletion / insertion: mean p(ŷ) over the curve grid with the top fraction removed / only it kept "
            f"({options.curve_steps} steps; lower deletion and higher insertion = more faithful)",
            f"95% intervals: percentile bootstrap over instances ({options.resamples} resamples, scipy.stats.bootstrap, seeded)",
            "agreement: mean Kendall τ-b over the removable items and top-k overlap (k = ceil(topk% of n)) per pair of methods",
            f"left out: {total - len(c.rows)} instance(s) with fewer than two removable items",
        ]
        if any(p.size for p, _ in c.plausible):
            notes.append("plausibility: AUPRC of the unit scores (|score| summed per word) against the rationale words, and "
                         "token F1 of the top-k words, k = the mean rationale size (ERASER's convention for soft scores)")
        if c.unaligned:
            notes.append(f"{c.unaligned} instance(s) whose rationale could not be mapped onto the model's items have no plausibility")
        if not options.methods:  # every method that applies was scored: say which did not, and why
            notes += [f"not scored: {m.name}: {reason}" for m in EXPLANATIONS.values() if (reason := m.applies(run))]
        return Result(
            test=self.name, summary=summary, instances=c.rows,
            tables={"scoreboard": board, "bins": bin_rows, "curves": curve_rows, "agreement": agreement_rows},
            meta={"notes": notes, "methods": methods, "modes": modes, "filler": fill, "published": PUBLISHED,
                  "csv_tables": ["scoreboard", "agreement"]},
        )

    def verdict(self, result: Result) -> list[dict[str, Any]]:
        """Per mode, the methods ranked by AOPC comprehensiveness and where attention and random stand."""
        rows = []
        for mode in result.meta.get("modes", []):
            board = [r for r in result.tables.get("scoreboard", []) if r["mode"] == mode and _finite(r.get("aopc_comp"))]
            if not board:
                continue
            ranked = sorted(board, key=lambda r: r["aopc_comp"], reverse=True)
            text = ", ".join(f"{r['method']} {r['aopc_comp']:.3f} [{r['aopc_comp_low']:.3f}, {r['aopc_comp_high']:.3f}]" for r in ranked)
            place = next((i + 1 for i, r in enumerate(ranked) if r["method"] == "attention"), None)
            chance = next((r for r in ranked if r["method"] == "random"), None)
            if place:
                text += f"; attention ranks {place} of {len(ranked)}"
            if chance and place:
                att = ranked[place - 1]
                beats = att["aopc_comp_low"] > chance["aopc_comp_high"]
                text += f" and {'beats' if beats else 'does not clearly beat'} random ({chance['aopc_comp']:.3f})"
            rows.append({"statistic": f"aopc_comp_ranking_{mode}", "value": ranked[0]["method"],
                         "published": PUBLISHED["alti_sst2_roberta"] if mode == "delete" else PUBLISHED["decompx_sst2_bert"],
                         "interpretation": f"AOPC comprehensiveness ({mode}; higher = more faithful): {text}"})
            ranked = sorted(board, key=lambda r: r["aopc_suff"])
            text = ", ".join(f"{r['method']} {r['aopc_suff']:.3f}" for r in ranked)
            rows.append({"statistic": f"aopc_suff_ranking_{mode}", "value": ranked[0]["method"], "published": "",
                         "interpretation": f"AOPC sufficiency ({mode}; lower = the top items alone keep the decision): {text}"})
        plausible = [r for r in result.tables.get("scoreboard", [])[: len(result.meta.get("methods", []))] if _finite(r.get("auprc"))]
        if plausible:
            ranked = sorted(plausible, key=lambda r: r["auprc"], reverse=True)
            rows.append({"statistic": "auprc_ranking", "value": ranked[0]["method"], "published": "",
                         "interpretation": "AUPRC against the known rationale: " + ", ".join(f"{r['method']} {r['auprc']:.3f}" for r in ranked)})
        return rows or super().verdict(result)

    def plot(self, result: Result, directory: Path) -> list[Path]:
        paths = _plot_lines(result, directory, "bins", ("comprehensiveness_mean", "sufficiency_mean"), "faithfulness_aopc",
                            "comprehensiveness and sufficiency per bin (AOPC = mean over the bins)")
        paths += _plot_lines(result, directory, "curves", ("deletion", "insertion"), "faithfulness_curves",
                             "p(ŷ) with the top fraction removed (deletion) / only it kept (insertion)")
        return paths + _plot_agreement(result, directory)


def _prefixed(prefix: str, stats: dict[str, Any]) -> dict[str, Any]:
    """``{prefix}_mean``, ``{prefix}_low``, ``{prefix}_high`` from :func:`~attnaudit.experiments.eraser_metrics.describe`."""
    return {f"{prefix}_mean": stats["mean"], f"{prefix}_low": stats["ci_low"], f"{prefix}_high": stats["ci_high"]}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _nanmean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def _rank(rows: list[dict[str, Any]], metric: str) -> None:
    """Add ``rank_{metric}`` (1 = best) to the rows whose metric is finite."""
    scored = sorted((r for r in rows if _finite(r.get(metric))), key=lambda r: r[metric], reverse=HIGHER_BETTER[metric])
    for place, row in enumerate(scored, 1):
        row[f"rank_{metric}"] = place


def _plot_lines(result: Result, directory: Path, table: str, columns: tuple[str, str], stem: str, title: str) -> list[Path]:
    """One panel per (mode, column): a line per method over the table's percents."""
    from attnaudit.plotting import pyplot

    rows = result.tables.get(table, [])
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    if not rows:
        return []
    plt = pyplot()
    fig, axes = plt.subplots(len(modes), 2, figsize=(10, 3.4 * len(modes)), squeeze=False, layout="constrained")
    for i, mode in enumerate(modes):
        for j, column in enumerate(columns):
            ax = axes[i][j]
            for method in dict.fromkeys(r["method"] for r in rows):
                points = [(r["percent"], r[column]) for r in rows if r["mode"] == mode and r["method"] == method]
                ax.plot([p for p, _ in points], [v if v is not None else np.nan for _, v in points], marker="o", ms=3, label=method)
            ax.set_xlabel("percent of the items")
            ax.set_title(f"{column.replace('_mean', '')} ({mode})", fontsize=10)
    axes[0][1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, directory, stem)


def _plot_agreement(result: Result, directory: Path) -> list[Path]:
    """Heatmaps of the mean Kendall τ and the top-k overlap between every pair of methods."""
    from attnaudit.plotting import pyplot

    rows = result.tables.get("agreement", [])
    names = list(dict.fromkeys(r["a"] for r in rows))
    if len(names) < 2:
        return []
    plt = pyplot()
    index = {n: i for i, n in enumerate(names)}
    fig, axes = plt.subplots(1, 2, figsize=(2 * (0.55 * len(names) + 2.5), 0.5 * len(names) + 2), layout="constrained")
    for ax, (column, low) in zip(axes, (("tau", -1.0), ("overlap", 0.0))):
        grid_ = np.full((len(names), len(names)), np.nan)
        for r in rows:
            grid_[index[r["a"]], index[r["b"]]] = np.nan if r[column] is None else r[column]
        image = ax.imshow(grid_, cmap="RdBu_r" if low < 0 else "viridis", vmin=low, vmax=1.0)
        for (i, j), value in np.ndenumerate(grid_):
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=6)
        ax.set_xticks(range(len(names)), names, rotation=90, fontsize=7)
        ax.set_yticks(range(len(names)), names, fontsize=7)
        ax.set_title("mean Kendall τ" if column == "tau" else "top-k overlap", fontsize=10)
        fig.colorbar(image, ax=ax, shrink=0.7)
    return save_figure(fig, directory, "faithfulness_agreement")
