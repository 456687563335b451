"""Collation into padded tensors and seeded, bucketed batch iteration."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnaudit.data.batching import IGNORE_INDEX, Collator, iterate_batches, length_groups, split_sentences
from attnaudit.data.types import Example
from attnaudit.data.vocab import Vocab
from attnaudit.errors import AttnAuditError, AttnAuditWarning, InputError


def ex(text: str, label: str | None = "pos", **kwargs: object) -> Example:
    return Example(tokens=text.split(), label=label, **kwargs)  # type: ignore[arg-type]


VOCAB = Vocab.build([["a", "b", "c", "d", ".", "?"]])


def test_classification_batch_shapes_padding_and_labels() -> None:
    collate = Collator(VOCAB, ["neg", "pos"], "classification")
    batch = collate([ex("a b c"), ex("d", "neg")])
    assert batch.tokens.shape == (2, 3) and batch.tokens.dtype == torch.long
    assert batch.tokens[1].tolist() == [VOCAB.stoi["d"], 0, 0]
    assert batch.mask.tolist() == [[True, True, True], [True, False, False]]
    assert batch.labels is not None and batch.labels.tolist() == [1, 0]
    assert len(batch) == 2 and batch.query is None and batch.features is None


def test_unlabelled_batch_has_no_labels() -> None:
    batch = Collator(VOCAB, ["neg", "pos"], "classification")([ex("a", None), ex("b c", None)])
    assert batch.labels is None


def test_tagging_labels_are_ignore_index_at_padding() -> None:
    tags = ["B-NP", "I-NP", "O"]
    collate = Collator(VOCAB, tags, "tagging", feature_vocab=Vocab.build([["DT", "NN"]]))
    first = Example(tokens=["a", "b"], tags=["B-NP", "I-NP"], meta={"features": ["DT", "NN"]})
    second = Example(tokens=["c"], tags=["O"], meta={"features": ["XX"]})
    batch = collate([first, second])
    assert batch.labels is not None and batch.labels.tolist() == [[0, 1], [2, IGNORE_INDEX]]
    assert batch.features is not None and batch.features.tolist() == [[2, 3], [1, 0]]


def test_pair_batch_has_query_and_mask() -> None:
    collate = Collator(VOCAB, ["no", "yes"], "pair")
    batch = collate([ex("a b", "yes", query=["c"]), ex("d", "no", query=["a", "b", "c"])])
    assert batch.query is not None and batch.query_mask is not None
    assert batch.query.shape == (2, 3) and batch.query_mask.sum(1).tolist() == [1, 3]
    with pytest.raises(InputError, match="without a query"):
        collate([ex("a", "yes")])


def test_hierarchical_batch_shapes_from_sentences_or_punctuation() -> None:
    collate = Collator(VOCAB, ["neg", "pos"], "classification", hierarchical=True)
    given_sentences = Example(tokens=["a", "b", "c"], label="pos", sentences=[["a"], ["b", "c"]])
    split_by_punctuation = ex("a b . c ? d")
    batch = collate([given_sentences, split_by_punctuation])
    assert batch.tokens.shape == (2, 3, 3)
    assert batch.mask.sum(-1).tolist() == [[1, 2, 0], [3, 2, 1]]
    assert batch.tokens[1, 1].tolist() == [VOCAB.stoi["c"], VOCAB.stoi["?"], 0]
    assert split_sentences(["a", ".", ".", "b"]) == [["a", "."], ["."], ["b"]]


def test_unknown_label_names_the_source_line() -> None:
    collate = Collator(VOCAB, ["neg", "pos"], "classification")
    bad = ex("a", "neutral", meta={"source": "data/test.csv:17"})
    with pytest.raises(InputError, match=r"^data/test\.csv:17: unknown label 'neutral'; known: neg, pos$"):
        collate([ex("b"), bad])
    tagger = Collator(VOCAB, ["O"], "tagging")
    with pytest.raises(InputError, match="unknown label 'B-X'"):
        tagger([Example(tokens=["a"], tags=["B-X"])])


def test_truncation_warns_once_per_call() -> None:
    collate = Collator(VOCAB, ["neg", "pos"], "classification", max_len=2)
    with pytest.warns(AttnAuditWarning, match=r"2 of 3 examples .* max_len=2") as record:
        batch = collate([ex("a b c"), ex("a b c d"), ex("a")])
    assert len(record) == 1 and batch.tokens.shape == (3, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        collate([ex("a b")])  # no truncation, no warning


def test_truncation_keeps_tags_and_features_aligned() -> None:
    collate = Collator(VOCAB, ["O", "X"], "tagging", max_len=2, feature_vocab=Vocab.build([["f"]]))
    example = Example(tokens=["a", "b", "c"], tags=["X", "O", "X"], meta={"features": ["f"] * 3})
    with pytest.warns(AttnAuditWarning):
        batch = collate([example])
    assert batch.labels is not None and batch.labels.tolist() == [[1, 0]]
    assert batch.features is not None and batch.features.shape == (1, 2)


@pytest.mark.parametrize(
    "example, message",
    [
        (Example(tokens=[], label="pos", meta={"source": "f.txt:3"}), r"f\.txt:3: example has no tokens"),
        (Example(tokens=["a"], label=None), "without a label in a labelled batch"),
    ],
)
def test_bad_examples_raise_input_errors(example: Example, message: str) -> None:
    with pytest.raises(InputError, match=message):
        Collator(VOCAB, ["neg", "pos"], "classification")([ex("a"), example])


def test_misaligned_tags_and_features() -> None:
    with pytest.raises(InputError, match="tags missing or not one per token"):
        Collator(VOCAB, ["O"], "tagging")([Example(tokens=["a", "b"], tags=["O"])])
    with pytest.raises(InputError, match="per-token features"):
        Collator(VOCAB, ["O"], "tagging", feature_vocab=VOCAB)([Example(tokens=["a"], tags=["O"])])
    with pytest.raises(AttnAuditError, match="no examples"):
        Collator(VOCAB, ["O"], "tagging")([])


# --- iterate_batches ------------------------------------------------------------------------


def examples_of_lengths(lengths: list[int]) -> list[Example]:
    return [Example(tokens=["a"] * n, label="pos", meta={"id": i}) for i, n in enumerate(lengths)]


def ids(batches: list) -> list[list[int]]:
    return [[e.meta["id"] for e in b.examples] for b in batches]


COLLATE = Collator(VOCAB, ["neg", "pos"], "classification")


def test_without_shuffle_the_order_is_kept() -> None:
    data = examples_of_lengths([5, 1, 4, 2, 3])
    assert ids(list(iterate_batches(data, COLLATE, 2))) == [[0, 1], [2, 3], [4]]


def test_shuffled_batches_depend_only_on_the_seed() -> None:
    data = examples_of_lengths([(i * 7) % 13 + 1 for i in range(40)])
    first = ids(list(iterate_batches(data, COLLATE, 4, shuffle=True, seed=1)))
    assert first == ids(list(iterate_batches(data, COLLATE, 4, shuffle=True, seed=1)))
    assert first != ids(list(iterate_batches(data, COLLATE, 4, shuffle=True, seed=2)))


def test_bucketing_reduces_padding() -> None:
    data = examples_of_lengths([(i * 7) % 23 + 1 for i in range(200)])

    def padding(bucket: bool) -> int:
        return sum(int((~b.mask).sum()) for b in iterate_batches(data, COLLATE, 8, True, 0, bucket))

    assert padding(bucket=True) < padding(bucket=False) / 4


@given(
    st.lists(st.integers(1, 9), min_size=1, max_size=60),
    st.integers(1, 7),
    st.booleans(),
    st.booleans(),
    st.integers(0, 3),
)
def test_every_example_appears_exactly_once(
    lengths: list[int], batch_size: int, shuffle: bool, bucket: bool, seed: int
) -> None:
    data = examples_of_lengths(lengths)
    batches = ids(list(iterate_batches(data, COLLATE, batch_size, shuffle, seed, bucket)))
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(1 <= len(b) <= batch_size for b in batches)


def test_bad_arguments() -> None:
    with pytest.raises(AttnAuditError, match="batch size"):
        list(iterate_batches(examples_of_lengths([1]), COLLATE, 0))
    with pytest.raises(AttnAuditError, match="max_len"):
        Collator(VOCAB, ["x"], "classification", max_len=0)
    with pytest.raises(AttnAuditError, match="not seq2seq"):
        Collator(VOCAB, ["x"], "seq2seq")


@given(st.lists(st.integers(0, 60), min_size=1, max_size=40), st.sampled_from([0.0, 0.1, 0.5]), st.sampled_from([0, 30, 200]))
def test_length_groups_partition_longest_first_within_the_slack(lengths: list[int], slack: float, floor: int) -> None:
    """Every instance in exactly one group; groups run from the longest down; padding a group to its longest
    member keeps the computed positions within 1 + slack of the real ones or within ``floor`` (a single instance
    always fits); and a group stops only where the next instance would break both, so no two neighbours could merge."""
    groups = length_groups(torch.tensor(lengths), slack, floor)
    flat = [i for g in groups for i in g.tolist()]
    assert sorted(flat) == list(range(len(lengths)))
    assert [lengths[i] for i in flat] == sorted(lengths, reverse=True)
    sized = [[lengths[i] for i in g.tolist()] for g in groups]
    for sizes in sized:
        padded = max(max(sizes), 1) * len(sizes)
        assert len(sizes) == 1 or padded <= (1 + slack) * sum(sizes) + 1e-9 or padded <= floor
    for sizes, after in zip(sized, sized[1:]):
        grown = [*sizes, after[0]]
        padded = max(max(grown), 1) * len(grown)
        assert padded > (1 + slack) * sum(grown) + 1e-9 and padded > floor


def test_select_takes_instances_and_cuts_their_common_padding() -> None:
    collate = Collator(VOCAB, ["X"], "tagging")
    batch = collate([ex("a b c d", None, tags=["X"] * 4), ex("a", None, tags=["X"]), ex("b c", None, tags=["X"] * 2)])
    sub = batch.select(torch.tensor([2, 1]))
    assert sub.tokens.tolist() == [batch.tokens[2, :2].tolist(), batch.tokens[1, :2].tolist()]
    assert sub.mask.tolist() == [[True, True], [True, False]]
    assert sub.labels is not None and sub.labels.shape == (2, 2) and sub.examples == [batch.examples[2], batch.examples[1]]
