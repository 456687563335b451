"""``--max-length`` (text-side truncation in tokens) and ``--dtype`` for Hugging Face models.

The cut batches are compared with batches of texts shortened by hand: the tiny tokenizers here
give one token per word (word-level for the Llama LM; the tiny BERT vocabulary holds every word
whole), so keeping N tokens of a text is keeping its first N words. A prompt's template and the
special tokens stay; a pair's query stays. Bad values end in one ``error:`` line.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from attnaudit.data.types import Example
from attnaudit.errors import AttnAuditError
from attnaudit.explain import item_mask
from attnaudit.explain.text import explain_text
from attnaudit.hf import load_hf
from tests.models.test_hf_decoder import save_llama_lm
from tests.reliability.helpers import assert_clean_failure, cli

VERBALIZER = {"neg": "bad", "pos": "good"}
PROMPT = "a dog runs , {text} was"


@pytest.fixture(scope="module")
def llama_lm(tiny_hf: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_llama_lm(tmp_path_factory.mktemp("llama-lm"), tiny_hf.vocab, seed=2)


def shortened(examples: list[Example], n: int) -> list[Example]:
    return [Example(tokens=ex.tokens[:n], query=ex.query, label=ex.label, meta=ex.meta) for ex in examples]


@pytest.mark.parametrize("n", [1, 2, 4])
def test_zero_shot_prompt_keeps_its_template(llama_lm: Path, tiny_hf: SimpleNamespace, n: int) -> None:
    cut = load_hf(llama_lm, task=tiny_hf.task(), device="cpu", prompt=PROMPT, verbalizer=VERBALIZER, max_length=n)
    whole = load_hf(llama_lm, task=tiny_hf.task(), device="cpu", prompt=PROMPT, verbalizer=VERBALIZER)
    examples = tiny_hf.task().test
    batch, hand = cut.collate(examples), whole.collate(shortened(examples, n))
    assert torch.equal(batch.tokens, hand.tokens) and torch.equal(batch.mask, hand.mask)
    assert torch.equal(item_mask(cut.model, batch), item_mask(whole.model, hand))
    assert int(item_mask(cut.model, batch).sum(1).max()) == n < max(len(ex.tokens) for ex in examples)
    assert cut.model.wordpieces(batch)[0][-1] == "was"  # the template's end is still there
    with torch.no_grad():
        torch.testing.assert_close(cut.model(batch).probs, whole.model(hand).probs)
    assert cut.info["max_length"] == n and "max_length" not in whole.info  # results of the two are told apart


@pytest.mark.parametrize("kind", ["classification", "pair"])
def test_encoder_cuts_the_text_only(tiny_hf: SimpleNamespace, kind: str) -> None:
    cut = load_hf(tiny_hf.dir, task=tiny_hf.task(kind), device="cpu", max_length=2)
    whole = load_hf(tiny_hf.dir, task=tiny_hf.task(kind), device="cpu")
    examples = tiny_hf.task(kind).test
    batch, hand = cut.collate(examples), whole.collate(shortened(examples, 2))
    assert torch.equal(batch.tokens, hand.tokens) and torch.equal(batch.mask, hand.mask)
    if kind == "pair":
        assert torch.equal(batch.features, hand.features)
        assert cut.model.wordpieces(batch)[0][-4:] == ["a", "dog", "runs", "[SEP]"]


def test_short_texts_are_untouched(llama_lm: Path, tiny_hf: SimpleNamespace) -> None:
    cut = load_hf(llama_lm, task=tiny_hf.task(), device="cpu", prompt=PROMPT, verbalizer=VERBALIZER, max_length=50)
    whole = load_hf(llama_lm, task=tiny_hf.task(), device="cpu", prompt=PROMPT, verbalizer=VERBALIZER)
    examples = tiny_hf.task().test
    assert torch.equal(cut.collate(examples).tokens, whole.collate(examples).tokens)


def test_dtype_by_name(llama_lm: Path, tiny_hf: SimpleNamespace) -> None:
    run = load_hf(llama_lm, task=tiny_hf.task(), device="cpu", prompt=PROMPT, verbalizer=VERBALIZER, dtype="bfloat16")
    assert {p.dtype for p in run.model.parameters()} == {torch.bfloat16} and run.info["dtype"] == "bfloat16"
    with pytest.raises(AttnAuditError, match="--dtype: expected float32 or bfloat16, got 'float64'"):
        load_hf(llama_lm, task=tiny_hf.task(), device="cpu", prompt=PROMPT, verbalizer=VERBALIZER, dtype="float64")
    with pytest.raises(AttnAuditError, match="--max-length must be a positive number of tokens, got 0"):
        load_hf(llama_lm, task=tiny_hf.task(), device="cpu", max_length=0)


def test_cli_max_length_and_dtype(llama_lm: Path, tmp_path: Path) -> None:
    """`attnaudit run` takes both options; the result records the cut (every instance has at most 2 items)."""
    out = tmp_path / "out"
    options = ("--hf", llama_lm, "--task", "synthetic", "--limit", "6", "--quiet", "--verbalizer", "negative=bad,positive=good")
    proc = cli("run", "importance", *options, "--out", out, "--max-length", "2", "--dtype", "float32")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split(",") for line in (out / "importance.csv").read_text().splitlines()]
    length = rows[0].index("length")
    assert rows[1:] and all(int(row[length]) <= 2 for row in rows[1:])
    bad = cli("run", "importance", *options, "--out", tmp_path / "bad", "--dtype", "float64")
    assert_clean_failure(bad, "--dtype: expected float32 or bfloat16", out=tmp_path / "bad")
    bad = cli("audit", "--task", "synthetic", "--model", "bilstm", "--max-length", "3", "--out", tmp_path / "bad2", "--quiet")
    assert_clean_failure(bad, "--max-length", out=tmp_path / "bad2")


def test_audit_records_max_length_for_its_report(llama_lm: Path, tmp_path: Path) -> None:
    """`attnaudit audit --max-length` cuts every test's texts and records it; `attnaudit report` reloads the model so."""
    out = tmp_path / "audit"
    proc = cli("audit", "--hf", llama_lm, "--task", "synthetic", "--limit", "4", "--only", "importance", "--max-length", "2",
               "--verbalizer", "negative=bad,positive=good", "--no-figures", "--out", out, "--quiet")
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "audit.json").read_text())
    assert record["max_length"] == 2 and "dtype" not in record
    instances = json.loads((out / "results" / "importance.json").read_text())["instances"]
    assert instances and all(row["length"] <= 2 for row in instances)
    again = cli("report", out, "--quiet")
    assert again.returncode == 0, again.stderr


def test_explain_takes_dtype(llama_lm: Path) -> None:
    """`explain` loads a decoder in bfloat16 when asked; a bad name is refused before any work."""
    explained = explain_text(str(llama_lm), "the movie was good", ["attention"], dtype="bfloat16", device="cpu")
    assert explained.tokens and explained.decision["kind"] == "next_token"
    with pytest.raises(AttnAuditError, match="--dtype: expected float32 or bfloat16"):
        explain_text(str(llama_lm), "the movie was good", ["attention"], dtype="half", device="cpu")
