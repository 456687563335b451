"""Parallel/RWTH readers, BPE word maps, the seq2seq collator and the synthetic translation task."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnaudit.data.types import Example
from attnaudit.data.word_alignments import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    Seq2SeqCollator,
    SubwordTokenizer,
    read_lines,
    read_parallel,
    read_rwth,
    read_sp_alignments,
    read_talp,
    remove_overlap,
    swap_pairs,
    synthetic_translation,
    tokenize,
    word_groups,
)
from attnaudit.errors import AttnAuditError, AttnAuditWarning, InputError


def test_read_lines_falls_back_to_latin1_and_drops_trailing_blank_lines(tmp_path):
    path = tmp_path / "de"
    path.write_bytes("daß Abhängiger\nzwei\n\n".encode("latin-1"))
    assert read_lines(path) == ["daß Abhängiger", "zwei"]
    path.write_bytes("daß\n".encode())
    assert read_lines(path) == ["daß"]


def test_tokenize_splits_punctuation_like_the_gold_sentences():
    assert tokenize("Wie Sie sahen, ist der \"Bug\" weg.") == ["Wie", "Sie", "sahen", ",", "ist", "der", '"', "Bug", '"', "weg", "."]
    assert tokenize("cherry-pick 9.00") == ["cherry-pick", "9.00"]


def test_read_parallel_skips_empty_pairs_and_rejects_misaligned_files(tmp_path):
    (tmp_path / "a.de").write_text("Ein Haus.\n\nZwei\n", encoding="utf-8")
    (tmp_path / "a.en").write_text("A house.\nnothing\nTwo\n", encoding="utf-8")
    with pytest.warns(AttnAuditWarning, match="skipped 1"):
        pairs = read_parallel(tmp_path / "a.de", tmp_path / "a.en")
    assert [(p.tokens, p.target) for p in pairs] == [(["Ein", "Haus", "."], ["A", "house", "."]), (["Zwei"], ["Two"])]
    assert pairs[1].meta["source"].endswith("a.de:3")
    (tmp_path / "b.en").write_text("one\n", encoding="utf-8")
    with pytest.raises(InputError, match="parallel files must align"):
        read_parallel(tmp_path / "a.de", tmp_path / "b.en")


def test_read_talp_is_one_based_source_first(tmp_path):
    path = tmp_path / "x.talp"
    path.write_text("1-1 2-3 3p2\n\n2p2\n", encoding="ascii")
    assert read_talp(path) == [({(0, 0), (1, 2)}, {(2, 1)}), (set(), set()), (set(), {(1, 1)})]
    path.write_text("1-1\n1-0\n", encoding="ascii")
    with pytest.raises(InputError, match=r"x.talp:2: bad link '1-0'"):
        read_talp(path)


def test_read_sp_alignments_and_negative_links(tmp_path):
    path = tmp_path / "alignmentDeEn"
    path.write_text("SENT: 0\nS 0 0\nP 1 2\n\nSENT: 1\nS 2 -100\nS 1 1\n", encoding="ascii")
    with pytest.warns(AttnAuditWarning, match="negative index"):
        assert read_sp_alignments(path) == [({(0, 0)}, {(1, 2)}), ({(1, 1)}, set())]
    path.write_text("SENT: 1\n", encoding="ascii")
    with pytest.raises(InputError, match="expected 'SENT: 0'"):
        read_sp_alignments(path)


def _write_gold(directory, links: str = "1-2 2-1 3p3\n") -> None:
    directory.mkdir()
    (directory / "de").write_bytes("daß ich komme\n".encode("latin-1"))
    (directory / "en").write_bytes(b"I that come\n")
    (directory / "alignmentDeEn.talp").write_text(links, encoding="ascii")


def test_read_rwth_builds_examples_with_links(tmp_path):
    _write_gold(tmp_path / "g")
    (example,) = read_rwth(tmp_path / "g")
    assert example.tokens == ["daß", "ich", "komme"] and example.target == ["I", "that", "come"]
    assert example.meta["sure"] == [(0, 1), (1, 0)] and example.meta["possible"] == [(2, 2)]


def test_read_rwth_rejects_links_outside_the_sentence(tmp_path):
    _write_gold(tmp_path / "g", "1-4\n")
    with pytest.raises(InputError, match=r"alignmentDeEn.talp:1: link \(1, 4\) outside"):
        read_rwth(tmp_path / "g")
    with pytest.raises(AttnAuditError, match="not found"):
        read_rwth(tmp_path / "missing")


def test_remove_overlap_matches_normalised_source_sentences():
    train = [
        Example(tokens=["Gibt", "es", "Einwände", "?"], target=["Any", "comments", "?"]),
        Example(tokens=["Gibt", "es", "Einwände?"], target=["Are", "there", "comments", "?"]),
        Example(tokens=["Nein", "."], target=["No", "."]),
    ]
    gold = [Example(tokens=["gibt", "es", "einwände", "?"], target=["Other", "?"])]
    kept, dropped, found = remove_overlap(train, gold)
    assert [ex.tokens for ex in kept] == [["Nein", "."]] and dropped == 2 and found == 1


@given(st.integers(0, 12))
def test_swap_pairs_is_a_permutation_swapping_neighbours(n):
    order = swap_pairs(n)
    assert sorted(order) == list(range(n))
    assert all(abs(order[i] - i) <= 1 for i in range(n))


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000))
def test_synthetic_translation_links_cover_every_target_word_once(seed):
    data = synthetic_translation(seed, n_train=5, n_dev=1, n_test=1)
    for ex in data.train:
        targets = sorted(t for _, t in ex.meta["sure"])
        assert targets == list(range(len(ex.target)))
        assert {s for s, _ in ex.meta["sure"]} == set(range(len(ex.tokens)))
    assert synthetic_translation(seed, 5, 1, 1).train == data.train  # deterministic


@pytest.fixture(scope="module")
def bpe() -> SubwordTokenizer:
    corpus = [["lower", "lowest", "newer", "newest"], ["low", "new", "wide", "widest"]] * 20
    return SubwordTokenizer.train(corpus, vocab_size=30)


def test_bpe_specials_word_map_and_round_trip(bpe, tmp_path):
    assert [bpe.tokenizer.token_to_id(s) for s in ("<pad>", "<unk>", "<s>", "</s>")] == [0, 1, 2, 3]
    words = ["lowest", "new", "widest"]
    ids, word_ids = bpe.encode(words)
    assert len(ids) > len(words) and word_ids == sorted(word_ids) and set(word_ids) == {0, 1, 2}
    assert bpe.words(ids) == words
    assert bpe.words([BOS_ID, *ids, EOS_ID, PAD_ID]) == words
    reloaded = SubwordTokenizer.load(bpe.save(tmp_path / "bpe.json"))
    assert reloaded.encode(words) == (ids, word_ids)
    (tmp_path / "bad.json").write_text("{", encoding="utf-8")
    with pytest.raises(InputError, match="not a tokenizers JSON"):
        SubwordTokenizer.load(tmp_path / "bad.json")


def test_word_groups_average_over_subwords():
    groups = word_groups([0, 0, 1, 2, 2, 2], 3)
    x = torch.arange(6.0)
    assert torch.allclose(groups @ x, torch.tensor([0.5, 2.0, 4.0]))


def test_collator_bos_eos_and_shifted_labels(bpe):
    collate = Seq2SeqCollator(bpe, bpe)
    batch = collate([Example(tokens=["low"], target=["new", "wide"]), Example(tokens=["lowest", "wide"], target=["low"])])
    n_src = len(bpe.encode(["lowest", "wide"])[0])
    assert batch.tokens.shape == (2, n_src + 1) and batch.tokens[1, n_src] == EOS_ID
    assert batch.mask.sum(1).tolist() == [len(bpe.encode(["low"])[0]) + 1, n_src + 1]
    tgt = bpe.encode(["new", "wide"])[0]
    assert batch.target[0].tolist() == [BOS_ID, *tgt]
    assert batch.labels[0].tolist() == [*tgt, EOS_ID]
    assert batch.target.shape == batch.labels.shape == batch.target_mask.shape
    n_low = len(bpe.encode(["low"])[0])
    assert batch.labels[1, n_low + 1 :].eq(-100).all() and batch.target[1, n_low + 1 :].eq(PAD_ID).all()
    assert batch.labels[1, n_low] == EOS_ID and not batch.target_mask[1, n_low + 1 :].any()
    source_only = collate([Example(tokens=["low"])])
    assert source_only.target is None and source_only.labels is None


def test_collator_truncates_with_a_warning_and_rejects_mixed_batches(bpe):
    collate = Seq2SeqCollator(bpe, bpe, max_len=3)
    with pytest.warns(AttnAuditWarning, match="truncated"):
        batch = collate([Example(tokens=["lowest", "widest", "newest"], target=["low"])])
    assert batch.tokens.shape[1] == 3 and batch.tokens[0, -1] == EOS_ID
    with pytest.raises(AttnAuditError, match="mixes"):
        collate([Example(tokens=["low"], target=["new"]), Example(tokens=["low"])])


def test_rwth_gold_set(shared_data):
    gold_dir = shared_data / "deen-alignment" / "DeEn"
    gold = read_rwth(gold_dir)
    assert len(gold) == 508
    assert sum(len(ex.meta["sure"]) for ex in gold) == 9613
    assert sum(len(ex.meta["possible"]) for ex in gold) == 921
    assert gold[0].tokens[4] == "daß"  # Latin-1 decoded
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AttnAuditWarning)
        sp = read_sp_alignments(gold_dir / "alignmentDeEn")
    differ = [
        i for i, (ex, (sure, possible)) in enumerate(zip(gold, sp))
        if set(ex.meta["sure"]) != sure or set(ex.meta["possible"]) != possible - sure
    ]
    assert differ == [178]  # the S/P file's one corrupt link "S 21 -100" (talp: 22-1)


def test_europarl_task_drops_the_gold_sentences(shared_data):
    from attnaudit.data.tasks import load_task

    data = load_task("europarl-deen", data_dir=shared_data)
    assert data.task_type == "seq2seq" and len(data.dev) == len(data.test) == 1000
    assert load_task("europarl-deen", data_dir=shared_data).dev == data.dev  # seeded hold-out
    lines = {ex.meta["source"] for ex in data.train}
    assert all("train.de:" in ex.meta["source"] for ex in data.dev)
    assert not any(ex.meta["source"] in lines for ex in data.dev)  # dev lines are held out of train
    assert all("test.de" in ex.meta["source"] for ex in data.test)
    assert any("of 8 RWTH gold sentences" in note for note in data.notes)
    kept, dropped, found = remove_overlap(data.train, read_rwth(shared_data / "deen-alignment" / "DeEn"))
    assert (dropped, found) == (0, 0)
