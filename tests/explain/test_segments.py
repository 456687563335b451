"""Segments (``--segments``): spans of a text as written against hand-made ones, tokens grouped through a byte-level BPE
and a WordPiece tokenizer's offsets, gradient scores summed per segment, leave-one-out removing (or replacing) a
segment as one unit against the same removal by hand, spans given in JSONL, and every bad input as one line."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from attnaudit.algorithms.metrics import output_change
from attnaudit.data.readers import read_jsonl
from attnaudit.data.segments import check_spans, token_segments, unit_spans
from attnaudit.data.types import Batch, Example
from attnaudit.errors import AttnAuditError
from attnaudit.explain import get_explanation
from attnaudit.explain.generation import decoder_rows
from attnaudit.explain.helpers.features import feature_groups
from attnaudit.explain.helpers.segments import add_segments, token_offsets
from attnaudit.explain.text import explain_text
from attnaudit.hf import load_hf
from attnaudit.models.interface import evaluation, language_model
from attnaudit.run import Run

TEXT = "The movie was good. The plot was bad!\nA dog runs, not fun.\n\nVery good movie."
HAND = {  # the spans a reader marks by hand
    "sentence": ["The movie was good.", "The plot was bad!", "A dog runs, not fun.", "Very good movie."],
    "line": ["The movie was good. The plot was bad!", "A dog runs, not fun.", "Very good movie."],
    "paragraph": ["The movie was good. The plot was bad!\nA dog runs, not fun.", "Very good movie."],
    "word": ["The", "movie", "was", "good", ".", "The", "plot", "was", "bad", "!", "A", "dog", "runs", ",", "not", "fun", ".",
             "Very", "good", "movie", "."],
}


def spans_of(pieces: list[str]) -> list[tuple[int, int]]:
    """Where each hand-made piece lies in ``TEXT``, searched in order."""
    out, at = [], 0
    for piece in pieces:
        start = TEXT.index(piece, at)
        out.append((start, start + len(piece)))
        at = start + len(piece)
    return out


@pytest.mark.parametrize("unit", list(HAND))
def test_spans_are_the_hand_made_ones(unit: str) -> None:
    assert unit_spans(TEXT, unit) == spans_of(HAND[unit])


@pytest.fixture(scope="module")
def bpe_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with a byte-level BPE tokenizer trained on the text (SmolLM2's kind of tokenizer)."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<pad>", "<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator([TEXT, "Dave met Sarah in Paris.", " Sarah Dave"] * 4, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=core.get_vocab_size(), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0)
    folder = tmp_path_factory.mktemp("bpe-lm")
    LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def encoder(tiny_hf: SimpleNamespace) -> Run:
    return load_hf(tiny_hf.dir, task=tiny_hf.task(), device="cpu")


def grouped_pieces(run: Run, batch: Batch, pieces: bool = False) -> list[str]:
    """Each segment's tokens decoded together (``pieces``: its wordpieces joined by spaces), by the batch's segment ids."""
    tokenizer = run.model.tokenizer
    ids, segments = batch.tokens[0].tolist(), batch.segments[0].tolist()
    groups = [[i for i, s in zip(ids, segments) if s == g] for g in range(max(segments) + 1)]
    return [" ".join(tokenizer.convert_ids_to_tokens(group)) if pieces else tokenizer.decode(group).strip() for group in groups]


@pytest.mark.parametrize("unit", list(HAND))
def test_wordpiece_tokens_fall_into_the_hand_made_segments(encoder: Run, unit: str) -> None:
    batch = encoder.collate([Example(tokens=TEXT.split(), meta={"text": TEXT})])
    add_segments(encoder.model, batch, unit)
    tokens = encoder.model.tokenizer.convert_ids_to_tokens(batch.tokens[0].tolist())
    assert tokens[0] == "[CLS]" and batch.segments[0, 0] == -1 and batch.segments[0, -1] == -1  # [CLS], [SEP]: no segment
    # BERT lower-cases and splits punctuation: the hand-made pieces, lower-cased, their words joined by single spaces
    expected = [" ".join(p.lower().replace(".", " .").replace("!", " !").replace(",", " ,").split()) for p in HAND[unit]]
    assert grouped_pieces(encoder, batch, pieces=True) == expected


@pytest.mark.parametrize("unit", list(HAND))
def test_bpe_tokens_fall_into_the_hand_made_segments(bpe_lm: Path, unit: str) -> None:
    run = load_hf(bpe_lm, device="cpu")
    ids = run.model.tokenizer(TEXT)["input_ids"]
    example = Example(tokens=TEXT.split(), meta={"text": TEXT})
    batch = Batch(tokens=torch.tensor([ids]), mask=torch.ones(1, len(ids), dtype=torch.bool), examples=[example])
    add_segments(run.model, batch, unit)
    assert grouped_pieces(run, batch) == HAND[unit]  # byte-level pieces decode to the text as written
    outside = [i for i, s in zip(ids, batch.segments[0].tolist()) if s < 0]  # only whitespace between segments ("\n\n")
    assert not run.model.tokenizer.decode(outside).strip()


def test_token_segments_by_hand() -> None:
    """A token goes to the segment holding most of its characters once its surrounding whitespace is left out."""
    text = "Dave met Sarah."
    spans = [(0, 4), (5, 14), (14, 15)]
    offsets = [None, (0, 4), (4, 8), (8, 14), (14, 15), (15, 15)]
    assert token_segments(text, offsets, spans) == [-1, 0, 1, 1, 2, -1]
    assert token_segments("a b\nc", [(0, 1), (1, 2), (3, 4), (4, 5)], [(0, 5)]) == [0, 0, 0, 0]  # whitespace inside a segment
    assert token_segments("a b\nc", [(0, 1), (3, 4), (4, 5)], [(0, 3), (4, 5)]) == [0, -1, 1]  # and between two


def test_gradient_scores_are_summed_per_segment(encoder: Run) -> None:
    example = Example(tokens=TEXT.split(), meta={"text": TEXT})
    plain = encoder.collate([example])
    per_token = get_explanation("gradient")(encoder, plain)[0]
    grouped = add_segments(encoder.model, encoder.collate([example]), "sentence")
    per_segment = get_explanation("gradient")(encoder, grouped)[0]
    groups = feature_groups(encoder.model, grouped)[0]
    for g in range(int(groups.max()) + 1):
        members = groups == g
        torch.testing.assert_close(per_segment[members], per_token[members].sum().expand(int(members.sum())))
    assert (per_segment[groups < 0] == 0).all()


def test_loo_over_a_segment_is_removing_its_tokens_by_hand(encoder: Run) -> None:
    model = encoder.model
    batch = add_segments(model, encoder.collate([Example(tokens=TEXT.split(), meta={"text": TEXT})]), "sentence")
    scores = get_explanation("loo")(encoder, batch)[0]
    masked = get_explanation("loo")(encoder, batch, baseline="mask")[0]
    groups = feature_groups(model, batch)[0]
    mask_id = model.tokenizer.mask_token_id
    with evaluation(model), torch.no_grad():
        full = model(batch).probs
        for g in range(int(groups.max()) + 1):
            keep = groups != g
            ids = batch.tokens[0][keep]
            removed = model(Batch(tokens=ids[None], mask=torch.ones(1, len(ids), dtype=torch.bool))).probs
            replaced = model(Batch(tokens=batch.tokens.masked_fill(~keep[None], mask_id), mask=batch.mask)).probs
            torch.testing.assert_close(scores[~keep], output_change(removed, full).expand(int((~keep).sum())))
            torch.testing.assert_close(masked[~keep], output_change(replaced, full).expand(int((~keep).sum())))


def test_decoder_loo_and_a_counterfactual_by_hand(bpe_lm: Path) -> None:
    """A next-token decision: leave-one-sentence-out through ``explain_text`` equals the change of the next-token
    distribution when the sentence's tokens are dropped by hand; ``--replace`` puts the replacement's tokens in."""
    text = "Dave met Sarah in Paris. The movie was good."
    explained = explain_text(bpe_lm, text, methods=["loo", "gradient"], segments="sentence", device="cpu")
    assert explained.tokens == ["Dave met Sarah in Paris.", "The movie was good."]
    assert explained.meta["segments"] == {"unit": "sentence", "spans": [[0, 24], [25, 44]]}
    words = explain_text(bpe_lm, text, methods=["loo"], segments="word", device="cpu", options={"replace": "Dave=Sarah"})
    run = load_hf(bpe_lm, device="cpu")
    lm = language_model(run.model, "test")
    tokenizer = lm.tokenizer
    ids = tokenizer(text)["input_ids"]
    cut = len(tokenizer("Dave met Sarah in Paris.")["input_ids"])
    swapped = tokenizer("Sarah")["input_ids"] + ids[len(tokenizer("Dave")["input_ids"]) :]  # the first word: no leading space
    with lm.next_token_decision(), evaluation(lm), torch.no_grad():
        def probs(row: list[int]) -> torch.Tensor:
            return lm(decoder_rows(lm, row, [], 1)).probs

        full = probs(ids)
        first, second = output_change(probs(ids[cut:]), full), output_change(probs(ids[:cut]), full)
        counterfactual = output_change(probs(swapped), full)
    torch.testing.assert_close(torch.tensor(explained.scores["loo"]), torch.cat([first, second]).float(), rtol=1e-4, atol=1e-6)
    assert words.tokens[0] == "Dave"
    torch.testing.assert_close(torch.tensor(words.scores["loo"][0]), counterfactual[0].float(), rtol=1e-4, atol=1e-6)


def test_spans_given_in_jsonl(tmp_path: Path, encoder: Run) -> None:
    rows = [{"text": "  " + TEXT.splitlines()[0], "label": "pos", "spans": [[2, 21], [22, 39]]}, {"text": "bad plot", "label": "neg"}]
    path = tmp_path / "given.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    examples = read_jsonl(path)
    assert examples[0].meta["spans"] == [[0, 19], [20, 37]]  # moved onto the text as kept (its leading spaces stripped)
    batch = add_segments(encoder.model, encoder.collate(examples), "token")  # the given spans, whatever the unit
    assert grouped_pieces(encoder, batch, pieces=True) == ["the movie was good .", "the plot was bad !"]
    real = int(batch.mask[1].sum())  # a row without spans, unit token: each token its own segment
    assert batch.segments[1].tolist() == list(range(real)) + [-1] * (batch.mask.shape[1] - real)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "bad plot", "label": "neg", "spans": [[0, 3], [2, 8]]}) + "\n", encoding="utf-8")
    with pytest.raises(AttnAuditError, match=r"bad.jsonl:1: spans: spans \[0, 3\) and \[2, 8\) overlap"):
        read_jsonl(bad)


@pytest.mark.parametrize(("spans", "message"), [
    ([[0, 5], [3, 8]], r"spans \[0, 5\) and \[3, 8\) overlap"),
    ([[0, 5], [70, 90]], r"span \[70, 90\) lies outside the text \(76 characters\)"),
    ([[4, 4]], r"empty span \[4, 4\)"),
    ([[3, 4]], r"span \[3, 4\) holds only whitespace"),
    ([[0, "a"]], r"each span is a pair of integers"),
    ([], r"give a non-empty list"),
])
def test_bad_spans(spans: list, message: str) -> None:
    with pytest.raises(AttnAuditError, match=message):
        check_spans(TEXT, spans)


def test_alignment_of_a_prompt(encoder: Run) -> None:
    """The text inside a zero-shot prompt: offsets shifted by where ``{text}`` starts."""
    example = Example(tokens=["good"], meta={"text": "good movie"})
    ids = encoder.model.tokenizer("review : good movie")["input_ids"]
    shift, places = token_offsets(encoder.model, example, ids, "review : {text}")
    assert shift == len("review : ") and places[0] is None and places[-2] is not None


@pytest.mark.parametrize(("segments", "message"), [
    ("[[0, 5], [3, 8]]", r"^error: --segments: spans \[0, 5\) and \[3, 8\) overlap$"),
    ("[[0, 5], [40, 99]]", r"^error: --segments: span \[40, 99\) lies outside the text \(19 characters\)$"),
    ("[[0, 5], [7, 7]]", r"^error: --segments: empty span \[7, 7\)"),
    ("sentence", r"^error: --segments sentence: the text has one sentence, so there is nothing to compare"),
    ("paragraph", r"^error: --segments paragraph: the text has one paragraph"),
    ("clause", r"^error: --segments: unknown unit 'clause'; choose token, word, sentence, line, paragraph"),
    ("[[0, 5]", r"^error: --segments: not a unit nor a JSON list"),
])
def test_bad_segments_are_one_line_exit_2_before_loading(tmp_path: Path, segments: str, message: str) -> None:
    """Refused before the model loads: a model folder that does not exist is never reached."""
    from tests.reliability.helpers import cli

    out = tmp_path / "out"
    done = cli("explain", "--hf", tmp_path / "no-such-model", "--text", "The movie was good.", "--segments", segments, "--out", out)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert re.search(message, done.stderr.strip()), done.stderr
    assert not out.exists()


@pytest.mark.parametrize(("options", "message"), [
    (["--replace", "Dave"], r"^error: --replace: give SEGMENT=REPLACEMENT pairs"),
    (["--baseline", "zero", "--method", "loo"], r"loo does not apply to this model: baseline 'zero' is IG's"),
    (["--baseline", "delete", "--method", "ig"], r"ig does not apply to this model: baseline 'delete' removes tokens"),
    (["--replace", "Paris=Rome", "--segments", "word", "--method", "loo"], r"^error: --replace: no segment reads 'Paris'"),
])
def test_bad_baselines_and_replacements(tmp_path: Path, bpe_lm: Path, options: list[str], message: str) -> None:
    from tests.reliability.helpers import cli

    out = tmp_path / "out"
    done = cli("explain", "--hf", bpe_lm, "--text", "The movie was good.", *options, "--out", out)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert re.search(message, done.stderr.strip()), done.stderr
    assert not out.exists()


@pytest.mark.parametrize("family", ["bilstm", "transformer"])
def test_native_words_are_tokens_and_sentences_group_them(tiny_attention_run, family: str) -> None:  # type: ignore[no-untyped-def]
    """attnaudit's own word-level models: ``word`` is each token its own segment; ``sentence`` groups the words, and
    leave-one-sentence-out is removing its words by hand (the BiLSTM's shortcut is not used for groups)."""
    run = tiny_attention_run(family)
    words = run.examples("test", 1)[0].tokens[:6]
    text = " ".join(words[:3]) + ". " + " ".join(words[3:6]) + "."
    example = Example(tokens=text.split(), meta={"text": text})
    assert add_segments(run.model, run.collate([example]), "word").segments[0].tolist() == [0, 1, 2, 3, 4, 5]  # "w3." is one token
    batch = add_segments(run.model, run.collate([example]), "sentence")
    assert batch.segments[0].tolist() == [0, 0, 0, 1, 1, 1]
    scores = get_explanation("loo")(run, batch)[0]
    with evaluation(run.model), torch.no_grad():
        full = run.model(batch).probs
        for g, kept in ((0, batch.tokens[:, 3:]), (1, batch.tokens[:, :3])):
            removed = run.model(Batch(tokens=kept, mask=torch.ones_like(kept, dtype=torch.bool))).probs
            torch.testing.assert_close(scores[3 * g : 3 * g + 3], output_change(removed, full).expand(3))


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_every_method_gives_one_score_per_segment(kind: str, encoder: Run, bpe_lm: Path) -> None:
    """Every registered method that applies (the costly ones too) works on segments: one finite score per sentence;
    the token-level ones equal the sum of their token scores."""
    from attnaudit.explain import list_explanations

    run = encoder if kind == "encoder" else load_hf(bpe_lm, device="cpu")
    methods = [m.name for m in list_explanations(run) if m.name != "random"]
    explained = explain_text(run, TEXT, methods=methods, segments="sentence", steps=2, device="cpu")
    plain = explain_text(run, TEXT, methods=methods, steps=2, device="cpu")
    assert explained.tokens == HAND["sentence"] and set(explained.scores) == set(methods)
    offsets = token_offsets(run.model, Example(tokens=TEXT.split(), meta={"text": TEXT}), plain.token_ids, None)
    assert offsets is not None
    owners = token_segments(TEXT, offsets[1], unit_spans(TEXT, "sentence"))
    for name, scores in explained.scores.items():
        assert len(scores) == 4 and all(torch.isfinite(torch.tensor(scores))), name
        if not get_explanation(name).grouped:
            sums = [sum(v for v, o in zip(plain.scores[name], owners) if o == g) for g in range(4)]
            torch.testing.assert_close(torch.tensor(scores), torch.tensor(sums), rtol=1e-4, atol=1e-6, msg=name)
