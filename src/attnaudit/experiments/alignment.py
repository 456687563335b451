"""Word alignment from cross-attention: weights vs norms (Kobayashi et al. 2020, section 5).

For each decoder block's cross-attention we teacher-force the gold translation and score
every (target, source) pair two ways:

* weight: ``α_ij`` averaged over heads;
* norm: ``‖Σ_h α^h_ij f_h(x_j)‖`` — the head-summed vector that source position ``j``
  adds to the output (:func:`attnaudit.explain.helpers.norms.layer_norms`), as in the paper.

Subword scores are merged into word scores by averaging over the subwords of the source
word and over the subwords of the target word. The source ``</s>`` is not a word and never
an alignment candidate. Each target word is aligned to its highest-scoring source word, in
two settings (Ding et al. 2019; Kobayashi et al. 2020):

* output: the attention of the decoder step that *produces* the target word (position
  ``p`` predicts subword ``p``);
* input: the attention of the step whose decoder *input* is that word (position ``p + 1``),
  i.e. shifted by one step.

AER (Och & Ney 2003, :func:`attnaudit.algorithms.metrics.aer`) is computed over the whole corpus from
the sure/possible gold links, per layer, and reported in percent like the paper.

``--baseline eflomal`` adds the statistical aligner a reader would use instead (trained on the
run's own training pairs plus the gold sentences; :mod:`attnaudit.experiments.aligner_baseline`):
AER mean/min/max over ``--baseline-runs`` runs for each direction, their intersection and
grow-diag-final, in the summary, the verdict and the table ``baseline``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnaudit.algorithms.metrics import aer
from attnaudit.data.tasks import DATA_ENV
from attnaudit.data.types import Example
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.experiment import Experiment, Result, register
from attnaudit.explain.helpers.norms import layer_norms
from attnaudit.plotting import save_figure
from attnaudit.progress import track
from attnaudit.run import Run

SETTINGS = ("output", "input")
BASELINES = ("none", "eflomal")
METHODS = ("weight", "norm")
PUBLISHED = {
    "output_weight_best": 47.7,
    "output_norm_best": 41.4,
    "input_weight_best": 29.8,
    "input_norm_best": 25.0,
    "source": "Kobayashi et al. 2020, Table 2: 6-layer, 4-head Transformer on ~1.9M Europarl De-En pairs, "
    "best layer AER (%) on the RWTH gold set",
}


def word_scores(scores: Tensor, target_words: list[int], source_words: list[int]) -> Tensor:
    """Merge a subword score matrix ``(T_sub, S_sub)`` into words ``(T_words, S_words)``:
    mean over the target word's subwords of the mean over the source word's subwords."""
    from attnaudit.data.word_alignments import word_groups

    rows = word_groups(target_words, max(target_words) + 1).to(scores)
    cols = word_groups(source_words, max(source_words) + 1).to(scores)
    return rows @ scores @ cols.t()


def argmax_links(words: Tensor) -> set[tuple[int, int]]:
    """``(source, target)`` links: each target word to its highest-scoring source word."""
    best = words.argmax(1).tolist()
    return {(source, target) for target, source in enumerate(best)}


def alignment_scores(run: Run, examples: list[Example], batch_size: int = 16) -> list[dict[str, dict[int, Tensor]]]:
    """Per example, per ``"{setting}_{method}"``, per decoder block: the word score matrix
    ``(target words, source words)`` (teacher-forced on ``example.target``).

    The collator's ``offsets`` (default ``(0, 0)``) are the positions of the first source and target
    subword: a tokenizer that puts a special token first (BART's ``<s>``) shifts both."""
    model = run.model
    collate: Any = run.collate
    cross = model.cross_layers
    a, b = getattr(collate, "offsets", (0, 0))  # specials before the first source / target subword (BART's <s>)
    out: list[dict[str, dict[int, Tensor]]] = []
    model.eval()
    with torch.no_grad():
        for batch in track(run.batches(examples, batch_size), "alignment", total=math.ceil(len(examples) / batch_size)):
            trace = model(batch).trace
            per_layer = []
            for index in cross:
                record = trace[index]
                per_layer.append((record.weights.mean(1), layer_norms(model, record, index).summed_norm))
            for i, ex in enumerate(batch.examples):
                _, src_words = collate.source.encode(ex.tokens)
                _, tgt_words = collate.target.encode(ex.target or [])
                s, t = len(src_words), len(tgt_words)
                if batch.tokens.shape[1] <= a + s or batch.target is None or batch.target.shape[1] <= b + t:
                    raise AttnAuditError(
                        f"{ex.meta.get('source', 'example')}: longer than the model's max_len; cannot align it"
                    )
                entry: dict[str, dict[int, Tensor]] = {f"{st}_{m}": {} for st in SETTINGS for m in METHODS}
                for block, matrices in enumerate(per_layer):
                    for method, matrix in zip(METHODS, matrices):
                        sub = matrix[i, b:, a : a + s].float().cpu()
                        entry[f"output_{method}"][block] = word_scores(sub[:t], tgt_words, src_words)
                        entry[f"input_{method}"][block] = word_scores(sub[1 : t + 1], tgt_words, src_words)
                out.append(entry)
    return out


def diagonal_links(source_words: int, target_words: int) -> set[tuple[int, int]]:
    """The position-only baseline: target word ``t`` to source word ``⌊(t + ½)·S/T⌋``."""
    return {(min(source_words - 1, int((t + 0.5) * source_words / target_words)), t) for t in range(target_words)}


def _links(example: Example, key: str) -> set[tuple[int, int]]:
    return {(int(s), int(t)) for s, t in example.meta.get(key, [])}


def _default_gold(run: Run) -> str:
    """The RWTH gold folder beside a Europarl run's data (``DATA/deen-alignment/DeEn``), or ""."""
    data_dir = run.task.data_dir or os.environ.get(DATA_ENV)
    if run.task.spec != "europarl-deen" or not data_dir:
        return ""
    folder = Path(data_dir) / "deen-alignment" / "DeEn"
    return str(folder) if folder.is_dir() else ""


def _check_options(options: Any) -> None:
    """Refuse bad option values before any work (and a missing eflomal before the attention pass)."""
    if options.batch_size < 1:
        raise AttnAuditError(f"--batch-size must be at least 1, got {options.batch_size}")
    if options.baseline not in BASELINES:
        raise AttnAuditError(f"--baseline must be one of {', '.join(BASELINES)}, got {options.baseline!r}")
    if options.baseline == "eflomal":
        from attnaudit.experiments.aligner_baseline import require_eflomal

        if options.baseline_runs < 1:
            raise AttnAuditError(f"--baseline-runs must be at least 1, got {options.baseline_runs}")
        require_eflomal()


def _eflomal(
    run: Run, examples: list[Example], runs: int, gold_sure: set[Any], gold_possible: set[Any], notes: list[str]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The eflomal baseline on the run's training pairs plus the gold sentences; appends its note."""
    from attnaudit.experiments.aligner_baseline import eflomal_baseline, training_pairs

    train = training_pairs(run)
    notes.append(
        f"eflomal baseline: trained on the run's {len(train)} training pairs plus the {len(examples)} gold "
        "sentences (without their links, as unsupervised aligners are), words as tokenised for the NMT run; "
        f"AER mean/min/max over {runs} runs (eflomal has no seed)"
    )
    return eflomal_baseline(train, examples, runs, gold_sure, gold_possible)


@register
class Alignment(Experiment):
    """The test of this module (its docstring gives the method, options and outputs)."""

    name = "alignment"
    description = "word alignment from NMT cross-attention, weights vs norms, AER per layer (Kobayashi et al.)"
    paper = "Kobayashi et al. 2020"
    examples = ("runs/nmt-deen --gold ../shared/data/deen-alignment/DeEn --data-dir ../shared/data",)

    @dataclass
    class Options:
        gold: str = field(
            default="",
            metadata={"help": "RWTH gold directory (de, en, alignmentDeEn.talp); default: the split's own links, "
                      "else for europarl-deen runs DATA/deen-alignment/DeEn."},
        )
        source_lang: str = field(default="de", metadata={"help": "Source file name in the gold directory."})
        target_lang: str = field(default="en", metadata={"help": "Target file name in the gold directory."})
        batch_size: int = field(default=16, metadata={"help": "Sentence pairs per forward pass."})
        baseline: str = field(
            default="none",
            metadata={"help": "Statistical aligner to report beside attention: none or eflomal (trained on the run's "
                      "training pairs plus the gold sentences; needs the optional eflomal==2.0.0)."},
        )
        baseline_runs: int = field(default=3, metadata={"help": "eflomal runs (it has no seed): AER mean, min, max."})

    def applies(self, run: Run) -> str | None:
        if run.task.task_type != "seq2seq" or not run.model.cross_layers:
            return ("alignment needs an encoder-decoder (NMT) model with cross-attention and a seq2seq task; train one "
                    "with train-nmt, or give --hf an encoder-decoder (Marian, BART, T5) with --task europarl-deen")
        return None

    def run(self, run: Run, examples: list[Example], options: Any, seed: int = 0) -> Result:
        notes = [
            "subword scores merged to words by averaging over source and target subwords; </s> is not a candidate",
            "norm = ||sum_h alpha^h f_h(x)|| (heads summed as vectors); weight = alpha averaged over heads",
            "output setting: the step that predicts the target word; input: the step that reads it (shifted by one)",
            "AER in percent, corpus level (Och & Ney 2003); diagonal_baseline: position-only alignment, no model",
        ]
        gold = options.gold or (_default_gold(run) if not all("sure" in ex.meta for ex in examples) else "")
        if gold:
            from attnaudit.data.word_alignments import read_rwth

            examples = read_rwth(gold, options.source_lang, options.target_lang)
            how = "" if options.gold else " (the RWTH set of the run's data directory: no --gold given)"
            notes.append(f"gold: {len(examples)} pairs from {gold}{how} (the run's split was not used)")
        elif not all("sure" in ex.meta for ex in examples):
            raise AttnAuditError("these examples carry no gold alignment: pass --gold DIR (RWTH format)")
        if any(ex.target is None for ex in examples):
            raise AttnAuditError("alignment needs sentence pairs (examples with a target)")
        _check_options(options)
        scores = alignment_scores(run, examples, options.batch_size)
        blocks = len(run.model.cross_layers)
        sure = [_links(ex, "sure") for ex in examples]
        possible = [_links(ex, "possible") for ex in examples]
        gold_sure = {(n, *link) for n, links in enumerate(sure) for link in links}
        gold_possible = {(n, *link) for n, links in enumerate(possible) for link in links}
        instances: list[dict[str, Any]] = [
            {"index": n, "source_words": len(ex.tokens), "target_words": len(ex.target or [])}
            for n, ex in enumerate(examples)
        ]
        rows = []
        for setting in SETTINGS:
            for block in range(blocks):
                row: dict[str, Any] = {"setting": setting, "layer": block + 1}
                for method in METHODS:
                    key = f"{setting}_{method}"
                    predicted: set[tuple[int, int, int]] = set()
                    for n, entry in enumerate(scores):
                        links = argmax_links(entry[key][block])
                        predicted |= {(n, *link) for link in links}
                        instances[n][f"aer_{key}_L{block + 1}"] = 100 * aer(links, sure[n], possible[n])
                    row[f"aer_{method}"] = 100 * aer(predicted, gold_sure, gold_possible)
                row["norm_minus_weight"] = row["aer_norm"] - row["aer_weight"]
                rows.append(row)
        summary: dict[str, Any] = {}
        for setting in SETTINGS:
            for method in METHODS:
                values = [r[f"aer_{method}"] for r in rows if r["setting"] == setting]
                best = int(np.argmin(values))
                summary[f"{setting}_{method}_best"] = values[best]
                summary[f"{setting}_{method}_best_layer"] = best + 1
                summary[f"{setting}_{method}_mean"] = float(np.mean(values))
            summary[f"{setting}_norm_better_layers"] = sum(
                r["aer_norm"] < r["aer_weight"] for r in rows if r["setting"] == setting
            )
        diagonal = {
            (n, *link) for n, ex in enumerate(examples) for link in diagonal_links(len(ex.tokens), len(ex.target or []))
        }
        summary["diagonal_baseline"] = 100 * aer(diagonal, gold_sure, gold_possible)
        summary["layers"] = blocks
        summary["pairs"] = len(examples)
        tables: dict[str, list[dict[str, Any]]] = {"layers": rows}
        if options.baseline == "eflomal":
            baseline, tables["baseline"] = _eflomal(run, examples, options.baseline_runs, gold_sure, gold_possible, notes)
            summary.update(baseline)
        return Result(
            test=self.name,
            summary=summary,
            instances=instances,
            tables=tables,
            meta={"notes": notes, "published": PUBLISHED},
        )

    def plot(self, result: Result, directory: Path) -> list[Path]:
        from attnaudit.plotting import pyplot

        plt = pyplot()

        rows = result.tables.get("layers", [])
        if not rows:
            return []
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), sharey=True)
        for ax, setting in zip(axes, SETTINGS):
            chosen = [r for r in rows if r["setting"] == setting]
            layers = [r["layer"] for r in chosen]
            for method, style in zip(METHODS, ("o--", "s-")):
                ax.plot(layers, [r[f"aer_{method}"] for r in chosen], style, label=method)
            for key, label, colour in (("diagonal_baseline", "diagonal", "grey"),
                                       ("eflomal_grow_diag_final_mean", "eflomal (gdf)", "green")):
                if key in result.summary:
                    ax.axhline(result.summary[key], linestyle=":", color=colour, label=label)
            ax.set_title(f"alignment with the {setting} word")
            ax.set_xlabel("decoder layer")
            ax.set_xticks(layers)
        axes[0].set_ylabel("AER (%)")
        axes[0].legend()
        fig.tight_layout()
        return save_figure(fig, directory, "alignment_aer_by_layer")

    def verdict(self, result: Result) -> list[dict[str, Any]]:
        rows = []
        for setting in SETTINGS:
            weight, norm = result.summary[f"{setting}_weight_best"], result.summary[f"{setting}_norm_best"]
            rows.append(
                {
                    "statistic": f"best-layer AER, {setting} setting (weight / norm)",
                    "value": f"{weight:.1f} / {norm:.1f}",
                    "published": f"{PUBLISHED[f'{setting}_weight_best']} / {PUBLISHED[f'{setting}_norm_best']}",
                    "interpretation": "norms align better than weights" if norm < weight
                    else "norms do not align better than weights here",
                }
            )
        if "eflomal_grow_diag_final_mean" in result.summary:
            rows.append(_eflomal_verdict(result.summary))
        return rows


def _eflomal_verdict(summary: dict[str, Any]) -> dict[str, Any]:
    """The verdict row of the eflomal baseline: grow-diag-final AER against the best attention layer."""
    mean, low, high = (summary[f"eflomal_grow_diag_final_{k}"] for k in ("mean", "min", "max"))
    attention = min(summary[f"{s}_{m}_best"] for s in SETTINGS for m in METHODS)
    gap = attention - mean
    return {
        "statistic": f"eflomal AER, grow-diag-final (mean [min, max] of {summary['eflomal_runs']} runs)",
        "value": f"{mean:.1f} [{low:.1f}, {high:.1f}]",
        "published": "",
        "interpretation": f"the statistical aligner is {gap:.1f} points better than the best attention layer ({attention:.1f})"
        if gap > 0 else f"the best attention layer ({attention:.1f}) is {-gap:.1f} points better than the statistical aligner",
    }
