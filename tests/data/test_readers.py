"""Readers on tiny files written in tmp_path: happy paths, encodings and located errors."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnaudit.data.readers import (
    read_ag_news,
    read_babi,
    read_conll,
    read_hf,
    read_jsonl,
    read_jw_sst_csv,
    read_plain_per_label,
    read_snli,
    read_sst_trees,
    read_table,
    read_text_lines,
    tokenize,
)
from attnaudit.errors import AttnAuditError, AttnAuditWarning, InputError


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# --- tokenize / read_text_lines ------------------------------------------------------------


def test_tokenize_splits_punctuation_and_lowercases() -> None:
    assert tokenize("It's a GREAT film, isn't it? (AP) 'quoted'") == [
        "it's", "a", "great", "film", ",", "isn't", "it", "?", "(", "ap", ")", "'", "quoted", "'",
    ]
    assert tokenize("John 's car") == ["john", "'s", "car"]
    assert tokenize("   ") == []


@given(st.text())
def test_tokenize_keeps_every_non_space_character(text: str) -> None:
    """Every character but whitespace and control characters (which never become tokens)."""
    tokens = tokenize(text)
    assert all(t and not re.search(r"\s", t) for t in tokens)
    assert "".join(tokens) == re.sub(r"[\s\x00-\x1f\x7f-\x9f]", "", text.lower())


def test_read_text_lines_handles_crlf_bom_and_gzip(tmp_path: Path) -> None:
    plain = tmp_path / "a.txt"
    plain.write_bytes("\ufeffone\r\ntwo\n".encode())
    assert read_text_lines(plain) == ["one", "two"]
    packed = tmp_path / "a.txt.gz"
    with gzip.open(packed, "wb") as handle:
        handle.write("ünï\ncode\n".encode())
    assert read_text_lines(packed) == ["ünï", "code"]


def test_latin1_file_is_read_with_one_warning(tmp_path: Path) -> None:
    path = tmp_path / "latin.txt"
    path.write_bytes("café\nnaïve\n".encode("latin-1"))
    with pytest.warns(AttnAuditWarning, match="not UTF-8, read as Latin-1") as record:
        assert read_text_lines(path) == ["café", "naïve"]
    assert len(record) == 1


def test_missing_empty_and_bad_gzip_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="file not found"):
        read_text_lines(tmp_path / "nope.txt")
    with pytest.raises(InputError, match="empty file"):
        read_text_lines(write(tmp_path / "empty.txt", "\n  \n"))
    bad = tmp_path / "bad.gz"
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(InputError, match="not a valid gzip file"):
        read_text_lines(bad)
    with pytest.raises(InputError, match="is a directory"):
        read_text_lines(tmp_path)


# --- CoNLL ------------------------------------------------------------------------------------

CONLL = "Patience NN B-NP\nin IN B-PP\nthe DT B-NP\n\n\nHe PRP B-NP\nwalks VBZ B-VP\n"


def test_read_conll(tmp_path: Path) -> None:
    examples = read_conll(write(tmp_path / "c.txt", CONLL))
    assert [e.tokens for e in examples] == [["Patience", "in", "the"], ["He", "walks"]]
    assert examples[0].tags == ["B-NP", "B-PP", "B-NP"]
    assert examples[1].meta["features"] == ["PRP", "VBZ"]
    assert examples[1].meta["source"].endswith("c.txt:6")


def test_read_conll_gzip_docstart_and_no_features(tmp_path: Path) -> None:
    path = tmp_path / "c.txt.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write("-DOCSTART- -X- O\n" + CONLL)
    examples = read_conll(path, feature_col=None)
    assert len(examples) == 2 and "features" not in examples[0].meta


def test_read_conll_column_errors_name_the_line(tmp_path: Path) -> None:
    path = write(tmp_path / "c.txt", "a DT B-NP\nb NN\n")
    with pytest.raises(InputError, match=r"c\.txt:2: expected 3 columns, found 2"):
        read_conll(path)
    with pytest.raises(InputError, match=r":1: 3 columns"):
        read_conll(write(tmp_path / "d.txt", "a DT B-NP\n"), feature_col=5)


# --- SST trees ----------------------------------------------------------------------------

TREE_POS = "(4 (2 It) (4 (2 is) (4 (4 great) (2 fun))))"
TREE_NEG = "(0 (1 (0 dull) (2 ,)) (2 (2 but) (3 ok)))"
TREE_NEUTRAL = "(2 (2 a) (2 film))"


def test_read_sst_trees_labels_phrases_and_rationale(tmp_path: Path) -> None:
    path = write(tmp_path / "t.txt", "\n".join([TREE_POS, TREE_NEUTRAL, TREE_NEG]) + "\n")
    pos, neg = read_sst_trees(path)
    assert pos.tokens == ["It", "is", "great", "fun"] and pos.label == "positive"
    assert pos.meta["phrases"] == [
        (0, 4, 4), (0, 1, 2), (1, 4, 4), (1, 2, 2), (2, 4, 4), (2, 3, 4), (3, 4, 2),
    ]
    # Label-4 phrases shorter than the sentence: "is great fun", "great fun", "great".
    assert pos.rationale == [1, 2, 3]
    assert neg.label == "negative" and neg.rationale == [0]
    assert neg.meta["source"].endswith("t.txt:3") and neg.meta["root_label"] == 0


def test_read_sst_trees_fine_grained_keeps_neutral(tmp_path: Path) -> None:
    path = write(tmp_path / "t.txt", "\n".join([TREE_POS, TREE_NEUTRAL]) + "\n")
    labels = [(e.label, e.rationale) for e in read_sst_trees(path, binary=False)]
    assert labels == [("very positive", [1, 2, 3]), ("neutral", None)]


@pytest.mark.parametrize(
    "tree, message",
    [
        ("(3 (2 a) (2 b)", "unbalanced '\\('"),
        ("(3 (2 a)) (2 b))", "more than one root|unbalanced"),
        ("(3 (7 a) (2 b))", "label '7' is not 0-4"),
        ("(3 (2 a) ())", "without a label"),
        ("word (2 a)", "outside a node"),
    ],
)
def test_malformed_trees_name_the_line(tmp_path: Path, tree: str, message: str) -> None:
    path = write(tmp_path / "t.txt", TREE_POS + "\n" + tree + "\n")
    with pytest.raises(InputError, match=rf"t\.txt:2: malformed tree: .*({message})"):
        read_sst_trees(path)


# --- CSV / TSV / JSONL -----------------------------------------------------------------------


def test_read_jw_sst_csv(tmp_path: Path) -> None:
    path = write(
        tmp_path / "sst.csv",
        "text,label,exp_split\na fine film,1,train\nbad,0,test\n\"dull , slow\",0,dev\n",
    )
    splits = read_jw_sst_csv(path)
    assert {k: [(e.tokens, e.label) for e in v] for k, v in splits.items()} == {
        "train": [(["a", "fine", "film"], "positive")],
        "dev": [(["dull", ",", "slow"], "negative")],
        "test": [(["bad"], "negative")],
    }
    with pytest.raises(InputError, match=r"sst\.csv:1: expected the header"):
        read_jw_sst_csv(write(tmp_path / "sst.csv", "sentence,label\nx,1\n"))
    with pytest.raises(InputError, match=r":3: label '2'"):
        read_jw_sst_csv(write(tmp_path / "sst.csv", "text,label,exp_split\na,1,train\nb,2,dev\n"))
    with pytest.raises(InputError, match=r":2: exp_split 'val'"):
        read_jw_sst_csv(write(tmp_path / "sst.csv", "text,label,exp_split\na,1,val\n"))


def test_read_table_by_name_and_index(tmp_path: Path) -> None:
    path = write(tmp_path / "d.csv", 'id,review,stars\n1,"Great, really!",5\n2,Meh.,2\n')
    examples = read_table(path, text_col="review", label_col="stars")
    assert [(e.tokens, e.label) for e in examples] == [
        (["great", ",", "really", "!"], "5"),
        (["meh", "."], "2"),
    ]
    assert examples[1].meta["source"].endswith("d.csv:3")
    headless = write(tmp_path / "h.csv", "Good one,pos,other text\nBad,neg,more\n")
    pair = read_table(headless, text_col=0, label_col=1, query_col=2, header=False)
    assert pair[0].query == ["other", "text"] and pair[1].label == "neg"


def test_read_table_tsv_keeps_quotes_literal(tmp_path: Path) -> None:
    path = write(tmp_path / "d.tsv", 'sentence\tlabel\n" quoted " start\t1\n')
    assert read_table(path, sep="\t", text_col="sentence")[0].tokens == ['"', "quoted", '"', "start"]


def test_read_table_multiline_cell_keeps_line_numbers(tmp_path: Path) -> None:
    path = write(tmp_path / "d.csv", 'text,label\n"two\nlines",a\nnext,b,extra\n')
    with pytest.raises(InputError, match=r"d\.csv:4: expected 2 columns, found 3"):
        read_table(path)


@pytest.mark.parametrize(
    "body, message",
    [
        ("text,label\nok,1\nonly\n", r":3: expected 2 columns, found 1"),
        ("text,label\nok,1\n,1\n", r":3: empty text cell"),
        ("text,label\nok,NaN\n", r":2: empty label cell"),
        ("text,label\nok,1\n\"open,1\n", r":3: malformed CSV"),
    ],
)
def test_read_table_errors_name_the_line(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        read_table(write(tmp_path / "d.csv", body))


def test_read_table_column_problems(tmp_path: Path) -> None:
    path = write(tmp_path / "d.csv", "text,label\na,1\n")
    with pytest.raises(InputError, match=r"no text column: unknown column 'review' \(choose from text, label\)"):
        read_table(path, text_col="review")
    assert [(e.tokens, e.label) for e in read_table(path, header=False)] == [(["text"], "label"), (["a"], "1")]
    with pytest.raises(InputError, match="no header row and 3 columns: give the text and label columns by number"):
        read_table(write(tmp_path / "w.csv", "a,1,x\nb,0,y\n"), header=False)
    with pytest.raises(AttnAuditError, match="given by name but the file has no header"):
        read_table(path, text_col="text", header=False)
    with pytest.raises(InputError, match="no column 7"):
        read_table(path, text_col=7)
    with pytest.raises(InputError, match="no data rows"):
        read_table(write(tmp_path / "e.csv", "text,label\n"))


def test_read_jsonl(tmp_path: Path) -> None:
    path = write(
        tmp_path / "d.jsonl",
        '{"text": "A cat.", "label": 1, "q": "Is it?"}\n\n{"text": ["pre", "split"], "label": "x", "q": "y"}\n',
    )
    first, second = read_jsonl(path, query_key="q")
    assert (first.tokens, first.label, first.query) == (["a", "cat", "."], "1", ["is", "it", "?"])
    assert second.tokens == ["pre", "split"] and second.meta["source"].endswith("d.jsonl:3")


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"text": "a", "label": 1', "invalid JSON"),
        ('["text"]', "expected a JSON object"),
        ('{"text": "a"}', "missing key 'label'"),
        ('{"text": 3, "label": 1}', "'text' must be a string or a list"),
        ('{"text": "", "label": 1}', "empty 'text'"),
        ('{"text": "a", "label": null}', "'label' must be a string or a number"),
    ],
)
def test_read_jsonl_errors_name_the_line(tmp_path: Path, line: str, message: str) -> None:
    path = write(tmp_path / "d.jsonl", '{"text": "fine", "label": 0}\n' + line + "\n")
    with pytest.raises(InputError, match=rf"d\.jsonl:2: {re.escape(message)}"):
        read_jsonl(path)


def test_read_plain_per_label(tmp_path: Path) -> None:
    files = {
        "pos": write(tmp_path / "p.txt", "good film\n\nfun\n"),
        "neg": write(tmp_path / "n.txt", "bad\n"),
    }
    examples = read_plain_per_label(files)
    assert [(e.tokens, e.label) for e in examples] == [
        (["good", "film"], "pos"), (["fun"], "pos"), (["bad"], "neg"),
    ]
    assert examples[1].meta["source"].endswith("p.txt:3")


def test_read_ag_news(tmp_path: Path) -> None:
    path = write(tmp_path / "ag.csv", '"2","Win","Team won #36;5 at\\\\home"\n"1","War","Bad"\n')
    examples = read_ag_news(path, ["World", "Sports"])
    assert examples[0].label == "Sports"
    assert examples[0].tokens == ["win", "team", "won", "$", "5", "at", "home"]
    with pytest.raises(InputError, match=r":1: class '2' is not 1-1"):
        read_ag_news(path, ["World"])


# --- SNLI / bAbI ----------------------------------------------------------------------------


def test_read_snli(tmp_path: Path) -> None:
    write(tmp_path / "s1.dev", "A man sleeps . \nKids play . \n")
    write(tmp_path / "s2.dev", "A person rests . \nNobody plays . \n")
    write(tmp_path / "labels.dev", "entailment\ncontradiction\n\n")
    examples = read_snli(tmp_path, "dev")
    assert [(e.tokens, e.query, e.label) for e in examples][1] == (
        ["kids", "play", "."], ["nobody", "plays", "."], "contradiction",
    )
    write(tmp_path / "labels.dev", "entailment\n")
    with pytest.raises(InputError, match=r"not line-aligned \(2, 2 and 1 lines\)"):
        read_snli(tmp_path, "dev")
    with pytest.raises(InputError, match=r"s1\.test: file not found"):
        read_snli(tmp_path, "test")


BABI = """1 Mary moved to the bathroom.
2 John went to the hallway.
3 Where is Mary? \tbathroom\t1
4 Mary went to the garden.
5 Where is Mary? \tgarden\t4
1 Sandra went to the office.
2 Where is Sandra? \toffice\t1
"""


def test_read_babi(tmp_path: Path) -> None:
    examples = read_babi(write(tmp_path / "qa.txt", BABI))
    assert len(examples) == 3
    second = examples[1]
    assert second.sentences == [
        ["mary", "moved", "to", "the", "bathroom", "."],
        ["john", "went", "to", "the", "hallway", "."],
        ["mary", "went", "to", "the", "garden", "."],
    ]
    assert second.tokens == [t for s in second.sentences for t in s]
    assert second.query == ["where", "is", "mary", "?"] and second.label == "garden"
    assert second.rationale == [12, 13, 14, 15, 16, 17] and second.meta["supporting"] == [2]
    assert examples[2].tokens == ["sandra", "went", "to", "the", "office", "."]  # story reset
    assert examples[2].meta["source"].endswith("qa.txt:7")
    assert second.meta["sentence_texts"] == ["Mary moved to the bathroom.", "John went to the hallway.", "Mary went to the garden."]
    assert second.meta["question"] == "Where is Mary?" and examples[2].meta["sentence_texts"] == ["Sandra went to the office."]


@pytest.mark.parametrize(
    "text, message",
    [
        ("1 Mary moved.\n2 Where? \tx\t9\n", r":2: supporting ids '9'"),
        ("1 Mary moved.\nWhere? \tx\t1\n", r":2: expected a line starting with its number"),
        ("1 Mary moved.\n2 Where?\tx\n", r":2: expected 'question"),
    ],
)
def test_read_babi_errors_name_the_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        read_babi(write(tmp_path / "qa.txt", text))


# --- Hugging Face -------------------------------------------------------------------------


def test_read_hf_maps_class_names_and_drops_unlabelled(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    calls: list[tuple[str, str | None, str]] = []

    def fake_load(path: str, name: str | None = None, split: str = "train") -> datasets.Dataset:
        calls.append((path, name, split))
        features = datasets.Features(
            {"sentence": datasets.Value("string"), "label": datasets.ClassLabel(names=["neg", "pos"])}
        )
        data = {"sentence": ["Nice film!", "Awful.", "hidden"], "label": [1, 0, -1]}
        return datasets.Dataset.from_dict(data, features=features)

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    with pytest.warns(AttnAuditWarning, match="dropped 1 unlabelled rows"):
        examples = read_hf("glue/sst2", "validation")
    assert calls == [("glue", "sst2", "validation")]
    assert [(e.tokens, e.label) for e in examples] == [(["nice", "film", "!"], "pos"), (["awful", "."], "neg")]
    assert examples[1].meta["source"] == "hf:glue/sst2[validation]:2"


def test_read_hf_pairs_and_namespaced_names(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    def fake_load(path: str, name: str | None = None, split: str = "train") -> datasets.Dataset:
        assert (path, name) == ("owner/nli", None)
        return datasets.Dataset.from_dict({"premise": ["A b."], "hypothesis": ["C."], "label": ["yes"]})

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    (example,) = read_hf("owner/nli/", "train")
    assert (example.tokens, example.query, example.label) == (["a", "b", "."], ["c", "."], "yes")


def test_read_hf_failures_are_one_line_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    def offline(*args: object, **kwargs: object) -> None:
        raise ConnectionError("Couldn't reach the Hub\nlong traceback text")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(AttnAuditError, match=r"^could not load hf:imdb split 'train': Couldn't reach the Hub$"):
        read_hf("imdb", "train")
    monkeypatch.setattr(
        datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_dict({"body": ["x"], "y": [1]})
    )
    with pytest.raises(AttnAuditError, match="cannot find the text/label columns among body, y"):
        read_hf("imdb", "train")
    assert read_hf("imdb", "train", text_key="body", label_key="y")[0].label == "1"


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32"])
def test_wide_encodings_are_read_by_their_byte_order_mark(tmp_path: Path, encoding: str) -> None:
    """Excel's "Unicode text" (UTF-16 with a BOM) and UTF-32 files read like UTF-8 ones."""
    path = tmp_path / "data.csv"
    bom = {"utf-16-be": "\ufeff"}.get(encoding, "")  # the plain codecs write their own mark; big-endian needs one
    path.write_bytes((bom + "text,label\ngood film,pos\nbad plot,neg\n").encode(encoding))
    assert [(ex.tokens, ex.label) for ex in read_table(path)] == [(["good", "film"], "pos"), (["bad", "plot"], "neg")]


@pytest.mark.parametrize(("delimiter", "named"), [(";", "';'"), ("\t", "tab")])
def test_a_csv_without_commas_is_read_with_its_delimiter_and_says_so(tmp_path: Path, delimiter: str, named: str) -> None:
    path = tmp_path / "data.csv"
    path.write_text(f"text{delimiter}label\ngood film{delimiter}pos\nbad plot{delimiter}neg\n", encoding="utf-8")
    with pytest.warns(AttnAuditWarning, match=f"read with {named} as the delimiter"):
        examples = read_table(path)
    assert [ex.label for ex in examples] == ["pos", "neg"]


def test_an_unknown_column_suggests_the_closest(tmp_path: Path) -> None:
    path = tmp_path / "data.csv"
    path.write_text("sentence,label\ngood film,pos\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"unknown column 'text' \(choose from sentence, label\) \(\?text=NAME picks another\)"):
        read_table(path)
    with pytest.raises(InputError, match="did you mean 'sentence'"):
        read_table(path, text_col="sentense")


def test_read_prompts_keeps_the_text_as_written(tmp_path: Path) -> None:
    from attnaudit.data.readers import read_prompts

    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "a\\n  b\\tc", "target": " d"}\n\n{"text": "e\\u0000f"}\n')
    plain = tmp_path / "p.txt"
    plain.write_text("Review: good\\nSentiment:\n\n")
    with pytest.warns(AttnAuditWarning, match="control character"):
        first, second = read_prompts(jsonl)
    assert first.meta["text"] == "a\n  b\tc" and first.meta["target"] == " d" and first.meta["source"].endswith("p.jsonl:1")
    assert second.meta["text"] == "ef" and second.meta["target"] is None
    (only,) = read_prompts(plain)
    assert only.meta["text"] == "Review: good\nSentiment:"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x", "target": 3}\n')
    with pytest.raises(InputError, match="bad.jsonl:1: 'target' must be a non-empty string"):
        read_prompts(bad)
