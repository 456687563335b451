"""Synthetic tasks: determinism, and that labels and rationales follow the stated rules."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from seqeval.metrics.sequence_labeling import get_entities

from attnaudit.data.synthetic import make_classification, make_tagging, synthetic_task
from attnaudit.data.types import Example
from attnaudit.errors import AttnAuditError


@pytest.mark.parametrize("make", [make_classification, make_tagging])
def test_same_seed_same_data_other_seed_other_data(make: Callable[..., list[Example]]) -> None:
    assert make(50, seed=7) == make(50, seed=7)
    assert make(50, seed=7) != make(50, seed=8)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000))
def test_classification_label_is_the_majority_and_rationale_the_signal(seed: int) -> None:
    for example in make_classification(20, seed):
        assert 8 <= len(example.tokens) <= 30
        signal = [i for i, t in enumerate(example.tokens) if t.startswith(("pos", "neg"))]
        assert example.rationale == signal
        n_pos = sum(example.tokens[i].startswith("pos") for i in signal)
        n_neg = len(signal) - n_pos
        assert n_pos != n_neg and example.meta["signal_counts"] == (n_pos, n_neg)
        assert example.label == ("positive" if n_pos > n_neg else "negative")


def test_classification_vocabulary_size_and_balance() -> None:
    examples = make_classification(400, seed=0, vocab_size=50, signal_words=3)
    vocab = {t for e in examples for t in e.tokens}
    assert len(vocab) <= 50 and {"pos0", "pos2", "neg1"} <= vocab
    positives = sum(e.label == "positive" for e in examples)
    assert 150 < positives < 250


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([None, 2, 3]))
def test_tagging_tags_follow_the_marker_rule(seed: int, span: int | None) -> None:
    for example in make_tagging(20, seed, span=span):
        assert example.tags is not None
        source = example.meta["rationale_per_token"]
        markers = [i for i, t in enumerate(example.tokens) if t.startswith("m")]
        assert example.rationale == markers and markers
        assert all(b - a >= 4 for a, b in zip(markers, markers[1:]))
        for i, (tag, src) in enumerate(zip(example.tags, source)):
            if src == -1:
                assert tag == "O"
                continue
            cls = example.tokens[src][1]
            previous = max(m for m in markers if m <= i)
            assert src == previous and tag == ("B-" if i == src else "I-") + cls
            if span is not None:
                assert i - src <= span
        # seqeval reads exactly one chunk per marker, starting at the marker.
        assert [start for _, start, _ in get_entities(example.tags)] == markers


def test_synthetic_task_splits_and_labels() -> None:
    task = synthetic_task("classification", seed=3, n_train=50, n_dev=10, n_test=5)
    assert (len(task.train), len(task.dev), len(task.test)) == (50, 10, 5)
    assert task.labels == ["negative", "positive"] and task.task_type == "classification"
    tagging = synthetic_task("tagging", seed=3, n_train=50, n_dev=10, n_test=5)
    assert tagging.task_type == "tagging" and tagging.name == "synthetic-tagging"
    assert {t for e in tagging.train for t in e.tags or []} <= set(tagging.labels)
    assert tagging.labels == ["B-A", "B-B", "B-C", "I-A", "I-B", "I-C", "O"]


def test_bad_arguments() -> None:
    with pytest.raises(AttnAuditError, match="unknown synthetic task"):
        synthetic_task("regression", 0)
    with pytest.raises(AttnAuditError, match="needs vocab_size"):
        make_classification(5, 0, vocab_size=10, signal_words=5)
    with pytest.raises(AttnAuditError, match="needs vocab_size"):
        make_tagging(5, 0, min_len=0)
