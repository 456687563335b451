"""Segments on a generated (or forced) sequence: each step explained over the prompt's segments (hand-made spans),
then each earlier generated token on its own. Gradient-type scores are the sums of the token-level ones over each
segment; leave-one-out and the perturbation methods remove a segment as one unit, against the same removal by hand
(the rows built from token ids and run alone); an encoder-decoder's source segments likewise."""

from __future__ import annotations

import math
from itertools import combinations
from pathlib import Path

import pytest
import torch

from attnaudit.algorithms.metrics import output_change
from attnaudit.data.segments import token_segments
from attnaudit.data.types import Example
from attnaudit.explain.generation import Generated, decoder_rows
from attnaudit.explain.helpers.segments import token_offsets
from attnaudit.explain.text import explain_text
from attnaudit.hf import load_hf
from attnaudit.models.interface import evaluation, language_model
from tests.explain.test_segments import bpe_lm  # noqa: F401  (the fixture: a tiny random Llama, byte-level BPE)

PROMPT = "Dave met Sarah in Paris. The movie was good."
SPANS = [[0, 24], [25, 44]]  # by hand: the two sentences
TARGET = " Sarah Dave"


def owners(run, ids: list[int]) -> list[int]:  # type: ignore[no-untyped-def]
    """Each prompt token's sentence (by the hand-made spans), through the tokenizer's offsets."""
    offsets = token_offsets(run.model, Example(tokens=PROMPT.split(), meta={"text": PROMPT}), ids, None)
    assert offsets is not None
    return token_segments(PROMPT, offsets[1], [tuple(s) for s in SPANS])


def test_forced_target_over_sentences(bpe_lm: Path) -> None:  # noqa: F811
    grouped = explain_text(bpe_lm, PROMPT, target=TARGET, methods=["gradient", "attention", "loo"], segments=str(SPANS).replace(" ", ""),
                           device="cpu")
    plain = explain_text(bpe_lm, PROMPT, target=TARGET, methods=["gradient", "attention"], device="cpu")
    assert isinstance(grouped, Generated) and isinstance(plain, Generated)
    run = load_hf(bpe_lm, device="cpu")
    lm = language_model(run.model, "test")
    ids = lm.tokenizer(PROMPT)["input_ids"]
    ys = [s["id"] for s in grouped.steps]
    owner = owners(run, ids)
    assert grouped.meta["segments"]["spans"] == SPANS and len(ys) >= 2
    with lm.next_token_decision(), evaluation(lm), torch.no_grad():
        for t in range(len(ys)):
            items = grouped.items[t]
            assert [i["token"] for i in items] == ["Dave met Sarah in Paris.", "The movie was good.", *[lm.tokenizer.decode([y]) for y in ys[:t]]]
            assert [i["side"] for i in items] == ["source"] * 2 + ["target"] * t and [i["segment"] for i in items] == list(range(2 + t))
            for name in ("gradient", "attention"):  # summed over each sentence's tokens; the generated tokens as they were
                token = plain.scores[name][t]
                sums = [sum(v for v, o in zip(token[: len(ids)], owner) if o == g) for g in range(2)]
                torch.testing.assert_close(torch.tensor(grouped.scores[name][t]), torch.tensor(sums + token[len(ids) :]), rtol=1e-4, atol=1e-7)
            full = lm(decoder_rows(lm, ids + ys[:t], [], 1)).probs
            removed = []
            for g in range(2 + t):  # each sentence, then each earlier generated token, deleted by hand
                row = [i for i, o in zip(ids, owner) if o != g] + [y for j, y in enumerate(ys[:t]) if 2 + j != g]
                removed.append(float(output_change(lm(decoder_rows(lm, row, [], 1)).probs, full)[0]))
            assert grouped.scores["loo"][t] == pytest.approx(removed, abs=1e-6)


def test_generated_kernel_shap_is_the_exact_shapley_value_of_whole_sentences(bpe_lm: Path) -> None:  # noqa: F811
    """``kernel_shap`` with every coalition (2^M samples) on a step of ``--generate``: the exact Shapley values of
    p(generated token) over the two sentences and the earlier generated token, each coalition's row built by hand."""
    generated = explain_text(bpe_lm, PROMPT, generate=2, methods=["kernel_shap"], segments="sentence", options={"samples": 8}, device="cpu")
    assert isinstance(generated, Generated)
    run = load_hf(bpe_lm, device="cpu")
    lm = language_model(run.model, "test")
    ids = lm.tokenizer(PROMPT)["input_ids"]
    ys = [s["id"] for s in generated.steps]
    owner = owners(run, ids) + [2]  # step 1 reads the first generated token as the third feature

    with lm.next_token_decision(), evaluation(lm), torch.no_grad():
        def value(kept: set[int]) -> float:
            row = [i for i, o in zip(ids + ys[:1], owner) if o in kept]
            return float(lm(decoder_rows(lm, row or [lm.config.pad_id], [], 1)).probs[0, ys[1]])

        m = 3
        exact = []
        for i in range(m):
            others = [j for j in range(m) if j != i]
            exact.append(sum(math.factorial(k) * math.factorial(m - k - 1) / math.factorial(m) * (value({*s, i}) - value(set(s)))
                             for k in range(m) for s in combinations(others, k)))
    assert generated.scores["kernel_shap"][1] == pytest.approx(exact, abs=1e-6)
    assert max(abs(v) for v in exact) > 1e-6


def test_an_encoder_decoder_over_source_segments(tmp_path: Path) -> None:
    """bart: the source's words grouped in two spans; gradient (both sides) sums the source tokens of a span and keeps
    the earlier target tokens; leave-one-out removes a span (NaN on the target side)."""
    from attnaudit.architectures import save_tiny

    text, spans = "the film was very good", [[0, 12], [13, 22]]
    folder = save_tiny("bart", tmp_path / "bart")
    grouped = explain_text(str(folder), text, target="a good", methods=["gradient", "loo"], segments=str(spans), device="cpu")
    plain = explain_text(str(folder), text, target="a good", methods=["gradient"], device="cpu")
    assert isinstance(grouped, Generated) and isinstance(plain, Generated)
    run = load_hf(str(folder), device="cpu")
    source = run.model.tokenizer(text)["input_ids"]
    offsets = token_offsets(run.model, Example(tokens=text.split(), meta={"text": text}), source, None)
    assert offsets is not None
    owner = token_segments(text, offsets[1], [tuple(s) for s in spans])
    assert sorted(set(owner)) == [-1, 0, 1]
    ys = [step["id"] for step in grouped.steps]

    def distribution(ids: list[int], t: int) -> torch.Tensor:
        with torch.no_grad():
            decoder = torch.tensor([[run.model.decoder_start, *ys[:t]]])
            return run.model.hf(input_ids=torch.tensor([ids]), decoder_input_ids=decoder).logits[0, -1].softmax(-1)

    for t in range(len(grouped.steps)):
        full = distribution(source, t)
        removed = [0.5 * float((distribution([i for i, o in zip(source, owner) if o != g], t) - full).abs().sum()) for g in range(2)]
        assert grouped.scores["loo"][t][:2] == pytest.approx(removed, abs=1e-5)
        assert [i["token"] for i in grouped.items[t][:2]] == ["the film was", "very good"]
        token = plain.scores["gradient"][t]
        sums = [sum(v for v, o in zip(token[: len(source)], owner) if o == g) for g in range(2)]
        torch.testing.assert_close(torch.tensor(grouped.scores["gradient"][t]), torch.tensor(sums + token[len(source) :]), rtol=1e-4, atol=1e-7)
        assert all(v == v for v in grouped.scores["loo"][t][:2]) and all(v != v for v in grouped.scores["loo"][t][2:])


def test_a_chat_prompt_is_segmented_on_the_users_text(bpe_lm: Path, tmp_path: Path) -> None:  # noqa: F811
    """With ``--chat`` the template's tokens are no segment: each sentence covers exactly its tokens inside the rendering."""
    import shutil

    from transformers import PreTrainedTokenizerFast

    folder = tmp_path / "chat"
    shutil.copytree(bpe_lm, folder)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    tokenizer.chat_template = ("{% for m in messages %}<eos>{{ m['role'] }}\n{{ m['content'] }}<eos>\n{% endfor %}"
                               "{% if add_generation_prompt %}<eos>assistant\n{% endif %}")
    tokenizer.save_pretrained(folder)
    generated = explain_text(folder, PROMPT, generate=2, methods=["loo"], segments="sentence", chat=True, device="cpu")
    assert isinstance(generated, Generated)
    first = generated.items[0]
    assert [i["token"] for i in first] == ["Dave met Sarah in Paris.", "The movie was good."] and {i["role"] for i in first} == {"user"}
    for item, sentence in zip(first, ["Dave met Sarah in Paris.", "The movie was good."]):
        assert "".join(generated.source[p] for p in item["positions"]).strip() == sentence
    assert all(v == v for v in generated.scores["loo"][1])


@pytest.mark.parametrize("family", ["gpt2", "gemma", "phi"])
def test_other_decoder_families(family: str, tmp_path: Path) -> None:
    """Tiny random GPT-2, Gemma and Phi (word-level tokenizers): each step over the two sentences, then the earlier
    generated token; gradient the sum of the token-level scores, leave-one-out and kernel_shap one finite score each."""
    from attnaudit.architectures import save_tiny

    text = "i really loved the movie . the plot was boring ."
    folder = save_tiny(family, tmp_path / family, seed=0)
    grouped = explain_text(str(folder), text, target="good movie", methods=["gradient", "loo", "kernel_shap"], segments="sentence", device="cpu")
    plain = explain_text(str(folder), text, target="good movie", methods=["gradient"], device="cpu")
    assert isinstance(grouped, Generated) and isinstance(plain, Generated) and len(grouped.steps) == 2
    sentences = ["i really loved the movie .", "the plot was boring ."]
    assert [i["token"] for i in grouped.items[1]] == [*sentences, "good"]
    run = load_hf(str(folder), device="cpu")
    ids = run.model.tokenizer(text)["input_ids"]
    offsets = token_offsets(run.model, Example(tokens=text.split(), meta={"text": text}), ids, None)
    assert offsets is not None
    owner = token_segments(text, offsets[1], [(0, 26), (27, 48)])  # by hand: the two sentences
    assert [text[a:b] for a, b in [(0, 26), (27, 48)]] == sentences
    for t in range(2):
        token = plain.scores["gradient"][t]
        sums = [sum(v for v, o in zip(token, owner) if o == g) for g in range(2)]
        torch.testing.assert_close(torch.tensor(grouped.scores["gradient"][t]), torch.tensor(sums + token[len(owner) :]), rtol=1e-4, atol=1e-7)
        assert all(math.isfinite(v) for name in ("loo", "kernel_shap") for v in grouped.scores[name][t])
