"""Zero-shot classification on a causal LM from the command line (``--prompt`` / ``--verbalizer``).

Faults: two labels whose verbalizer words share a first token (here: the task's default words,
both unknown to a tiny vocabulary), a verbalizer that cannot be read, and ``--prompt`` without
``--hf``, each end with one ``error:`` line, exit 2, nothing written. A good prompt and
verbalizer make the tests that need a prediction run on the LM.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from .helpers import assert_clean_failure, cli


@pytest.fixture(scope="module")
def llama_lm(tiny_hf: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny random Llama causal LM with a word-level tokenizer over the tiny vocabulary."""
    folder = tmp_path_factory.mktemp("llama-lm")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tiny_hf.vocab), pad_token_id=0, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )
    LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(tiny_hf.vocab)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", pad_token="[PAD]", eos_token="[SEP]").save_pretrained(folder)
    return folder


def run_importance(llama_lm: Path, out: Path, *options: str) -> object:
    return cli("run", "importance", "--hf", llama_lm, "--task", "synthetic", "--limit", "4", "--out", out, "--quiet", *options)


def test_default_verbalizer_sharing_a_first_token_is_refused(llama_lm: Path, tmp_path: Path) -> None:
    line = assert_clean_failure(run_importance(llama_lm, tmp_path / "out"), "--verbalizer", out=tmp_path / "out")
    assert "share their first token '[UNK]'" in line


def test_unreadable_verbalizer(llama_lm: Path, tmp_path: Path) -> None:
    proc = run_importance(llama_lm, tmp_path / "out", "--verbalizer", "negative")
    line = assert_clean_failure(proc, "--verbalizer", out=tmp_path / "out")
    assert "cannot read" in line


def test_prompt_without_hf(tmp_path: Path) -> None:
    proc = cli("audit", "--task", "synthetic", "--model", "bilstm", "--prompt", "x {text}", "--out", tmp_path / "out", "--quiet")
    assert_clean_failure(proc, "--prompt applies with --hf only", out=tmp_path / "out")


def test_prompt_and_verbalizer_make_importance_run(llama_lm: Path, tmp_path: Path) -> None:
    proc = run_importance(llama_lm, tmp_path / "out", "--prompt", "the {text}\\nwas", "--verbalizer", 'negative="bad",positive=good')
    assert proc.returncode == 0, proc.stderr[-2000:]
    meta = json.loads((tmp_path / "out" / "importance.json").read_text())["meta"]
    assert meta["n"] == 4
    assert any("zero-shot: prompt 'the {text}\\nwas'" in note and "template tokens are not ranked" in note for note in meta["notes"])


def test_audit_takes_prompt_and_verbalizer(llama_lm: Path, tmp_path: Path) -> None:
    proc = cli(
        "audit", "--hf", llama_lm, "--task", "synthetic", "--limit", "4", "--only", "importance", "--no-figures",
        "--prompt", "the {text} was", "--verbalizer", "negative=bad,positive=good", "--out", tmp_path / "out", "--quiet",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    meta = json.loads((tmp_path / "out" / "results" / "importance.json").read_text())["meta"]
    assert meta["n"] == 4 and any("verbalizer {'negative': 'bad', 'positive': 'good'}" in note for note in meta["notes"])
