"""``--limit N`` draws a seeded sample stratified by label (``--limit-order first``: the first N), and every
result says what was audited. A test split sorted by label (as Jain & Wallace's SST test split is: 93% of its
first 500 sentences are positive) audited with ``--limit`` covers both labels in the split's proportions."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnaudit.data.subsets import describe, label_counts, limited
from attnaudit.data.types import Example
from attnaudit.errors import AttnAuditError
from attnaudit.progress import is_quiet, set_quiet
from attnaudit.training.trainer import train
from tests.reliability.helpers import cli, synthetic_rows, write_table


def examples(labels: list[str]) -> list[Example]:
    return [Example(tokens=[f"w{i}"], label=label) for i, label in enumerate(labels)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from("abc"), min_size=1, max_size=60), st.integers(1, 70), st.integers(0, 5))
def test_a_stratified_sample_keeps_each_label_s_share_and_the_order(labels: list[str], limit: int, seed: int) -> None:
    items = examples(labels)
    chosen = limited(items, limit, seed)
    assert len(chosen) == min(limit, len(items))
    positions = [items.index(ex) for ex in chosen]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    counts, total = Counter(ex.label for ex in chosen), Counter(labels)
    for label, size in total.items():
        assert abs(counts[label] - len(chosen) * size / len(items)) < 1.0 + 1e-9  # largest remainders: within one
    assert chosen == limited(items, limit, seed)  # same seed, same sample


def test_first_keeps_the_first_and_bad_values_are_refused() -> None:
    items = examples(["a"] * 5 + ["b"] * 5)
    assert limited(items, 4, order="first") == items[:4]
    assert label_counts(limited(items, 4)) == {"a": 2, "b": 2}
    assert limited(items, None) == items and limited(items, 50) == items
    with pytest.raises(AttnAuditError, match="--limit-order must be one of stratified, first"):
        limited(items, 4, order="random")
    with pytest.raises(AttnAuditError, match="--limit must be at least 1"):
        limited(items, 0)
    record = describe("test", items, limited(items, 4, seed=3), 4, "stratified", 3)
    assert record == {"split": "test", "n": 4, "of": 10, "limit": 4, "chosen": "stratified by label, seed 3",
                      "labels": {"a": 2, "b": 2}, "split_labels": {"a": 5, "b": 5}}


def test_tagging_examples_are_drawn_uniformly() -> None:
    items = [Example(tokens=["x", "y"], label=["B-NP", "I-NP"]) for _ in range(10)]
    assert len(limited(items, 3, seed=1)) == 3 and label_counts(items) == {}


@pytest.fixture(scope="module")
def sorted_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BiLSTM whose test file lists every positive example first."""
    folder = tmp_path_factory.mktemp("sorted")
    rows = synthetic_rows(160)
    write_table(folder / "train.csv", rows[:120])
    write_table(folder / "test.csv", sorted(rows[120:], key=lambda row: row[1], reverse=True))
    previous = is_quiet()
    set_quiet(True)
    try:
        run = train(f"csv:{folder / 'train.csv'}", "bilstm", folder / "run", test=f"csv:{folder / 'test.csv'}",
                    epochs=1, embed_dim=8, hidden_dim=8, quiet_eval=True)
    finally:
        set_quiet(previous)
    assert run.path is not None
    return run.path


def test_an_audit_of_a_label_sorted_split_covers_both_labels(sorted_run: Path, tmp_path: Path) -> None:
    for order, out in (("stratified", tmp_path / "stratified"), ("first", tmp_path / "first")):
        done = cli("audit", "--run", sorted_run, "--only", "importance", "--limit", "10", "--limit-order", order,
                   "--out", out, "--no-figures", "--explore", "0", "--quiet")
        assert done.returncode == 0, done.stderr
    meta = json.loads((tmp_path / "stratified" / "results" / "importance.json").read_text())["meta"]
    split, chosen = meta["subset"]["split_labels"], meta["subset"]["labels"]
    assert len(split) == 2 and set(chosen) == set(split) and meta["subset"]["chosen"] == "stratified by label, seed 0"
    assert all(abs(chosen[label] - 10 * size / sum(split.values())) < 1 for label, size in split.items())
    first = json.loads((tmp_path / "first" / "results" / "importance.json").read_text())["meta"]["subset"]
    assert len(first["labels"]) == 1 and first["chosen"] == "first"
    report = (tmp_path / "stratified" / "report.html").read_text(encoding="utf-8")
    assert "audited: 10 of 40 (stratified by label, seed 0)" in report
