"""Segments in the tests' erasures: ERASER removes (or masks) whole segments, ranked by their summed scores, equal to
the same removal by hand; the faithfulness and erasure tests count segments as items under ``segments=``; a segmented
result has its own fingerprint."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch

from attnaudit.data.types import Batch, Example, TaskData
from attnaudit.experiments.eraser_metrics import perturbation_probs, removable_items
from attnaudit.experiments.erasure import prepare
from attnaudit.experiments.experiment import get_experiment
from attnaudit.experiments.runner import fingerprint, make_options, run_test
from attnaudit.explain.helpers.features import feature_groups
from attnaudit.explain.helpers.segments import segmented
from attnaudit.hf import load_hf
from attnaudit.models.interface import evaluation
from attnaudit.run import Run

TEXTS = [
    ("the movie was good . the plot was bad !", "pos"),
    ("a dog runs . the movie was not very fun . good plot !", "neg"),
    ("very fun movie ! not good .", "pos"),
    ("bad plot . good dog !", "neg"),
]


@pytest.fixture(scope="module")
def run(tiny_hf) -> Run:  # type: ignore[no-untyped-def]
    examples = [Example(tokens=t.split(), label=y, meta={"text": t, "source": f"s:{i}"}) for i, (t, y) in enumerate(TEXTS)]
    task = TaskData(name="sentences", task_type="classification", train=examples, dev=examples, test=examples, labels=["neg", "pos"])
    return load_hf(tiny_hf.dir, task=task, device="cpu")


def test_eraser_removes_the_top_segments_as_units(run: Run) -> None:
    sentences = segmented(run, "sentence")
    batch = sentences.collate(run.data().test)
    model = run.model
    groups = feature_groups(model, batch)
    assert removable_items(model, batch).sum(1).tolist() == [2, 3, 2, 2]  # one per sentence
    scores = torch.rand(groups.shape, generator=torch.Generator().manual_seed(0))
    summed = torch.zeros_like(scores)
    for b in range(len(batch)):  # what the registry gives: each item carries its segment's sum
        for g in range(int(groups[b].max()) + 1):
            summed[b, groups[b] == g] = scores[b, groups[b] == g].sum()
    without, only = perturbation_probs(model, batch, {"m": summed}, [50.0], "delete")
    with evaluation(model), torch.no_grad():
        pred = model(batch).probs.argmax(-1)
        for b in range(len(batch)):
            count = int(groups[b].max()) + 1
            segment_scores = [float(summed[b, groups[b] == g][0]) for g in range(count)]
            top = sorted(range(count), key=lambda g: -segment_scores[g])[: min(count - 1, -(-count // 2))]  # ceil(50 % of n), at most n-1
            real = batch.mask[b].bool()
            dropped = torch.isin(groups[b], torch.tensor(top)) & real
            kept = real & ~(groups[b] >= 0) | torch.isin(groups[b], torch.tensor(top))  # only the top (+ [CLS], [SEP])
            for keep, value in ((real & ~dropped, without[0, 0, b]), (kept & real, only[0, 0, b])):
                ids = batch.tokens[b][keep]
                probs = model(Batch(tokens=ids[None], mask=torch.ones(1, len(ids), dtype=torch.bool))).probs
                assert float(probs[0, pred[b]]) == pytest.approx(float(value), abs=1e-6)


def test_erasure_prepares_one_item_per_segment(run: Run) -> None:
    sentences = segmented(run, "sentence")
    batch = sentences.collate(run.data().test)
    explained = prepare(sentences, batch)
    assert explained.lengths.tolist() == [2, 3, 2, 2]
    first = explained.mask[1].nonzero().squeeze(1)
    spread = explained.erased(torch.nn.functional.one_hot(first[1], explained.mask.shape[1]).bool()[None], torch.tensor([1]))
    assert spread[0].tolist() == (explained.groups[1] == 1).tolist()  # the whole second sentence


def test_tests_count_segments(run: Run, tmp_path: Path) -> None:
    result = run_test("faithfulness", run, out=tmp_path / "f", segments="sentence", methods=["gradient", "attention"], plot=False,
                      ig_steps=2, resamples=20, curve_steps=2)
    assert result.meta["segments"] == "sentence"
    assert sorted(pd.read_csv(tmp_path / "f" / "faithfulness.csv")["items"]) == [2, 2, 2, 3]  # sentences, not tokens
    erased = run_test("erasure", run, out=tmp_path / "e", segments="sentence", rankings=["attention", "gradient"], random_orders=1, plot=False)
    rows = [row for row in erased.tables["until_flip"] if row["ranking"] == "attention"]
    assert sorted(row["length"] for row in rows) == [2, 2, 2, 3]
    assert all(row["removed"] is None or 1 <= row["removed"] <= row["length"] - 1 for row in rows)


def test_segments_change_the_fingerprint(run: Run) -> None:
    options = make_options(get_experiment("faithfulness"), {})
    plain = fingerprint("faithfulness", run, options, split="test", limit=None, seed=0, figures=False)
    words = fingerprint("faithfulness", segmented(run, "word"), options, split="test", limit=None, seed=0, figures=False)
    assert "segments" not in plain and words["segments"] == "word" and plain["hash"] != words["hash"]


def test_an_audit_with_segments_shows_them(run: Run, tmp_path: Path) -> None:
    """``audit --segments``: the tests, the report's heatmaps and its explorer all see one item per sentence, named by
    its text, and ``audit.json`` records the unit (a rebuilt report reads it)."""
    import json

    from attnaudit.audit import audit

    audit(tmp_path, run=run, only=["importance"], test_options={"importance": {"methods": ["gradient"]}}, heatmap_instances=1,
          explore=2, figures=False, segments="sentence")
    assert json.loads((tmp_path / "audit.json").read_text(encoding="utf-8"))["segments"] == "sentence"
    texts = {text for text, _ in TEXTS}
    for name in ("heatmaps.json", "explorer.json"):
        for entry in json.loads((tmp_path / "results" / name).read_text(encoding="utf-8"))["instances"]:
            assert " ".join(entry["items"]) in texts and len(entry["items"]) in (2, 3), entry["items"]
