"""Vocabulary building, persistence and word-vector loading."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnaudit.data.vocab import PAD, UNK, Vocab, load_vectors
from attnaudit.errors import AttnAuditError, AttnAuditWarning, InputError


def test_build_orders_by_frequency_then_token() -> None:
    vocab = Vocab.build([["b", "a", "c"], ["a", "c", "d"], ["a"]], specials=["<cls>"])
    assert vocab.itos == [PAD, UNK, "<cls>", "a", "c", "b", "d"]
    assert (vocab.pad_id, vocab.unk_id, len(vocab)) == (0, 1, 7)
    assert Vocab.build([["b", "a", "c"], ["a", "c", "d"]], min_freq=2).itos == [PAD, UNK, "a", "c"]
    assert Vocab.build([["b", "a", "c"], ["a", "c", "d"]], max_size=1).itos == [PAD, UNK, "a"]


def test_specials_in_data_are_not_duplicated() -> None:
    vocab = Vocab.build([["<unk>", "<pad>", "x"]])
    assert vocab.itos == [PAD, UNK, "x"]


def test_encode_decode_with_unknown_tokens() -> None:
    vocab = Vocab.build([["the", "cat"]])
    assert vocab.encode(["the", "dog", "cat"]) == [vocab.stoi["the"], 1, vocab.stoi["cat"]]
    assert vocab.decode([vocab.stoi["cat"], 0, 1]) == ["cat", PAD, UNK]
    assert "cat" in vocab and "dog" not in vocab
    with pytest.raises(AttnAuditError, match="id out of range"):
        vocab.decode([99])


@given(st.lists(st.lists(st.text(min_size=1, max_size=5), max_size=6), max_size=6))
def test_encode_decode_round_trip(token_lists: list[list[str]]) -> None:
    vocab = Vocab.build(token_lists)
    for tokens in token_lists:
        if not {PAD, UNK} & set(tokens):
            assert vocab.decode(vocab.encode(tokens)) == tokens
    assert Vocab.from_dict(vocab.to_dict()) == vocab


def test_save_load_round_trip(tmp_path: Path) -> None:
    vocab = Vocab.build([["é", "x", "x"]], specials=["<bos>"])
    path = vocab.save(tmp_path / "sub" / "vocab.json")
    assert Vocab.load(path) == vocab
    assert Vocab.load(path).encode(["x", "é", "?"]) == vocab.encode(["x", "é", "?"])


def test_load_rejects_bad_files(tmp_path: Path) -> None:
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"specials": ["<pad>",\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"bad\.json:2: invalid JSON"):
        Vocab.load(bad_json)
    wrong = tmp_path / "wrong.json"
    wrong.write_text('{"specials": ["<unk>", "<pad>"], "tokens": []}', encoding="utf-8")
    with pytest.raises(InputError, match=r"wrong\.json: invalid vocabulary"):
        Vocab.load(wrong)
    duplicate = tmp_path / "dup.json"
    duplicate.write_text('{"specials": ["<pad>", "<unk>"], "tokens": ["a", "a"]}', encoding="utf-8")
    with pytest.raises(InputError, match="listed twice"):
        Vocab.load(duplicate)
    with pytest.raises(InputError, match="file not found"):
        Vocab.load(tmp_path / "none.json")


# --- vectors --------------------------------------------------------------------------------


def vectors_file(tmp_path: Path, text: str, name: str = "vec.txt") -> Path:
    path = tmp_path / name
    if name.endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as handle:
            handle.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_load_vectors_glove_format(tmp_path: Path) -> None:
    vocab = Vocab.build([["the", "cat", "Dog"]])
    path = vectors_file(tmp_path, "the 1 2 3\ncat 4 5 6\ndog 7 8 9\nzebra 0 0 1\n")
    matrix = load_vectors(path, vocab)
    assert matrix.shape == (5, 3) and matrix.dtype == torch.float32
    assert torch.equal(matrix[vocab.stoi["cat"]], torch.tensor([4.0, 5.0, 6.0]))
    assert torch.equal(matrix[vocab.stoi["Dog"]], torch.tensor([7.0, 8.0, 9.0]))  # lower-case match
    assert torch.equal(matrix[0], torch.zeros(3))
    assert 0 < matrix[1].abs().max() < 1  # <unk>: small random


def test_exact_case_wins_over_lowercase_match(tmp_path: Path) -> None:
    vocab = Vocab.build([["Apple", "apple"]])
    for text in ("apple 1 1\nApple 2 2\n", "Apple 2 2\napple 1 1\n"):
        matrix = load_vectors(vectors_file(tmp_path, text), vocab)
        assert matrix[vocab.stoi["Apple"]].tolist() == [2.0, 2.0]
        assert matrix[vocab.stoi["apple"]].tolist() == [1.0, 1.0]


def test_load_vectors_word2vec_header_gzip_and_seeded_unknowns(tmp_path: Path) -> None:
    vocab = Vocab.build([["a", "b", "c"]])
    path = vectors_file(tmp_path, "2 2\na 1 1\nb 2 2\n", "w2v.txt.gz")
    first = load_vectors(path, vocab, dim=2, seed=3)
    again = load_vectors(path, vocab, dim=2, seed=3)
    other = load_vectors(path, vocab, dim=2, seed=4)
    c = vocab.stoi["c"]
    assert torch.equal(first, again) and not torch.equal(first[c], other[c])
    assert first[vocab.stoi["b"]].tolist() == [2.0, 2.0]


def test_words_with_spaces_are_accepted(tmp_path: Path) -> None:
    vocab = Vocab.build([["at home", "x"]])
    matrix = load_vectors(vectors_file(tmp_path, "x 1 1\nat home 3 4\n"), vocab)
    assert matrix[vocab.stoi["at home"]].tolist() == [3.0, 4.0]


@pytest.mark.parametrize(
    "text, dim, message",
    [
        ("a 1 2 3\nb 1 2\n", None, r"vec\.txt:2: expected a word and 3 numbers, found 3 fields"),
        ("a 1 2\nb 1 2 3\n", None, r"vec\.txt:2: expected a word and 2 numbers, found 4 fields"),
        ("2 3\na 1 2 3\n", 4, r"vec\.txt:1: header says dimension 3, expected 4"),
        ("a 1 x\n", None, r"vec\.txt:1: vector values must be numbers"),
        ("", None, r"vec\.txt: empty file"),
    ],
)
def test_load_vectors_errors_name_the_line(tmp_path: Path, text: str, dim: int | None, message: str) -> None:
    vocab = Vocab.build([["a", "b"]])
    with pytest.raises(InputError, match=message):
        load_vectors(vectors_file(tmp_path, text), vocab, dim=dim)


def test_low_coverage_warns(tmp_path: Path) -> None:
    vocab = Vocab.build([["a", "b", "c"]])
    with pytest.warns(AttnAuditWarning, match=r"cover only 1/3 vocabulary words \(33%\)"):
        load_vectors(vectors_file(tmp_path, "a 1\nz 2\n"), vocab)
