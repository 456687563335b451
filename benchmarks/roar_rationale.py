"""What did each ROAR curve's masks remove? Measured against the data's gold rationale (bAbI's supporting facts).

A retrained model can only score where the masked data still holds what the label needs. On bAbI the answer is a
word of the supporting fact ("Where is Mary?" – "bathroom", read in "Mary went to the bathroom"): once that word is
masked, nothing in the story says where Mary is. So the share of instances whose masks hit the answer word bounds
what the retrain can score from above, and says why a curve falls.

For every ``ratio-K.masks.json`` a ROAR run kept (``RUN/subruns/roar/seed-S/CURVE/`` as ``attnaudit run roar`` writes
them, ``RUN-roar/subruns/roar/...`` as ``benchmarks/reproduce_roar.py`` does) and each split: of the instances with a
rationale, the share whose masks hit one of its tokens (``rationale_hit``; a HAN run's masks name sentences, each
masking all its words) and the mean share of its tokens masked
(``rationale_masked``); of those whose rationale holds the answer as a word, the share whose masks hit it
(``answer_hit``), the share whose masks hide every one of its occurrences in the text (``answer_everywhere``), and
the accuracy of guessing by elimination (``elimination``): one guess, uniform, among the labels no unmasked word of
the text names (all labels where every one is named). A mask that hides the answer wherever it stands and leaves the
other candidates readable tells the retrain the answer: it can score above chance with the answer masked.
And the retrain's test score where it finished, and on the test split its accuracy apart on the instances whose
answer some unmasked word still names (``by_answer.readable``) and on those whose every occurrence is masked
(``by_answer.hidden``): the retrain loaded from its folder, the masks applied as the roar test applies them (none for
a retrain restored from a ledger, which keeps no weights). The splits are the base run's own (``config.json``'s
task, read again), in the order the masks list them.
Run: ``python benchmarks/roar_rationale.py --runs ../runs-babi --data-dir ../shared/data --name roar_babi_rationale``;
writes ``benchmarks/results/NAME.json``.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnaudit.data.types import Example, TaskData  # noqa: E402
from attnaudit.experiments.roar import mask_example, mask_token, masked_positions, rationale_hit  # noqa: E402
from attnaudit.io import read_json  # noqa: E402
from attnaudit.run import TaskSpec, load_run, read_config  # noqa: E402
from attnaudit.training.trainer import predict  # noqa: E402
from benchmarks.common import write_result  # noqa: E402

SPLITS = ("train", "dev", "test")


def occurrences(example: Example) -> set[int]:
    """Every position of the text whose word is the answer (the gold label as a word)."""
    label = str(example.label).lower()
    return {i for i, t in enumerate(example.tokens) if t.lower() == label}


def answer_items(example: Example) -> set[int]:
    """The rationale's tokens that are the answer itself (the gold label as a word; empty where it is none)."""
    return set(example.rationale or []) & occurrences(example)


def elimination(example: Example, masked: set[int], labels: set[str]) -> float:
    """The chance that one uniform guess among the labels no unmasked word of the text names is the answer (among all
    labels where the text names every one): what a reader scores who only sees which candidates are still there."""
    named = {t.lower() for i, t in enumerate(example.tokens) if i not in masked} & labels
    left = (labels - named) or labels
    return float(str(example.label).lower() in left) / len(left)


def hits(examples: list[Example], masks: list[list[int]], sentences: bool = False, labels: list[str] | None = None) -> dict[str, Any]:
    """One split's masks against its examples' rationales (shares over the instances they apply to; None: none do);
    ``sentences``: the masks name HAN's sentences; ``labels``: the task's labels (for ``elimination``)."""
    if len(examples) != len(masks):
        raise SystemExit(f"{len(masks)} masks for {len(examples)} instances: the masks are not this run's split")
    tokens = [masked_positions(ex, m, sentences) for ex, m in zip(examples, masks)]
    with_rationale = [(set(ex.rationale), m) for ex, m in zip(examples, tokens) if ex.rationale]
    answered = [(ex, m) for ex, m in zip(examples, tokens) if answer_items(ex)]
    with_answer = [(answer_items(ex), m) for ex, m in answered]
    candidates = {str(label).lower() for label in labels or []}

    def share(values: list[float]) -> float | None:
        return sum(values) / len(values) if values else None

    return {
        "instances": len(examples), "with_rationale": len(with_rationale), "with_answer": len(with_answer),
        "rationale_hit": rationale_hit(examples, masks, sentences),  # what the roar test's curves report
        "rationale_masked": share([len(r & m) / len(r) for r, m in with_rationale]),
        "answer_hit": share([float(bool(a & m)) for a, m in with_answer]),
        "answer_everywhere": share([float(occurrences(ex) <= m) for ex, m in answered]),
        "elimination": share([elimination(ex, m, candidates) for ex, m in answered]) if candidates else None,
    }


def by_answer(retrain: Path, examples: list[Example], masks: list[list[int]], sentences: bool) -> dict[str, Any] | None:
    """The retrain's accuracy on the masked ``examples`` whose answer an unmasked word still names (``readable``) and
    on those whose every occurrence is masked (``hidden``), each with its count, over the instances whose rationale
    holds the answer (as ``answer_hit``); None where none does."""
    answered = [(ex, m) for ex, m in zip(examples, masks) if answer_items(ex)]
    if not answered:
        return None
    run = load_run(retrain, device="cpu")
    token = mask_token(run)
    pred = predict(run, [mask_example(ex, m, token, sentences) for ex, m in answered])["pred"]
    groups: dict[str, list[float]] = {"readable": [], "hidden": []}
    for (ex, m), guess in zip(answered, pred):
        hidden = occurrences(ex) <= masked_positions(ex, m, sentences)
        groups["hidden" if hidden else "readable"].append(float(guess == ex.label))
    return {name: {"instances": len(v), "accuracy": sum(v) / len(v) if v else None} for name, v in groups.items()}


def ratio_of(path: Path) -> int:
    match = re.fullmatch(r"ratio-(\d+)\.masks\.json", path.name)
    if match is None:
        raise SystemExit(f"{path}: not a ratio-K.masks.json file")
    return int(match.group(1))


def one_roar(roar: Path, data: TaskData, sentences: bool = False) -> dict[str, Any]:
    """Every seed's curves under ``roar`` (a ``subruns/roar`` folder): per curve and ratio, each split's hits."""
    out: dict[str, Any] = {}
    for masks_file in sorted(roar.glob("seed-*/*/ratio-*.masks.json"), key=lambda p: (p.parent.as_posix(), ratio_of(p))):
        curve = masks_file.parent.relative_to(roar).as_posix()
        masks = read_json(masks_file)
        row: dict[str, Any] = {split: hits(data.split(split), masks[split], sentences, data.labels) for split in SPLITS}
        metrics = masks_file.with_name(f"ratio-{ratio_of(masks_file)}") / "metrics.json"
        row["test_score"] = read_json(metrics).get("test") if metrics.exists() else None
        # a finished retrain with its weights (one restored from reproduce_roar's ledger has its scores only)
        retrained = metrics.exists() and any(metrics.parent.glob("*.safetensors"))
        row["by_answer"] = by_answer(metrics.parent, data.test, masks["test"], sentences) if retrained else None
        out.setdefault(curve, {})[str(ratio_of(masks_file))] = row
    return out


def base_run(folder: Path) -> Path:
    """The run whose ROAR sub-runs ``folder/subruns`` holds: ``folder`` itself, or ``RUN`` for ``RUN-roar``."""
    if (folder / "config.json").is_file():
        return folder
    if folder.name.endswith("-roar") and (base := folder.with_name(folder.name[: -len("-roar")])).is_dir():
        return base
    raise SystemExit(f"{folder}: holds ROAR masks but is no run, nor RUN-roar beside a run RUN")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, required=True, help="folder of runs with ROAR sub-runs (RUN/subruns; RUN-roar/subruns beside RUN)")
    parser.add_argument("--data-dir", type=Path, default=None, help="where the runs' data is (default: as recorded)")
    parser.add_argument("--name", default="roar_rationale")
    args = parser.parse_args()
    result: dict[str, Any] = {}
    for roar in sorted(args.runs.glob("*/subruns/roar")):
        base = base_run(roar.parents[1])
        config = read_config(base)
        task = TaskSpec(**config["task"])
        sentences = config["model"].get("model") == "han"  # HAN's items are sentences (the config, not the weights, says so)
        curves = one_roar(roar, task.load(args.data_dir), sentences)
        result[base.name] = {"task": task.spec, "curves": curves}
        for curve, ratios in curves.items():
            line = ", ".join(f"{k} % {r['test']['answer_hit']:.3f}" for k, r in ratios.items() if r["test"]["answer_hit"] is not None)
            print(f"{base.name} {curve}: test answer word masked in {line}")
    if not result:
        raise SystemExit(f"{args.runs}: no RUN/subruns/roar or RUN-roar/subruns/roar folder found")
    write_result(args.name, {"runs": result})


if __name__ == "__main__":
    main()
