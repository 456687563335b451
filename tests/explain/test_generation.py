"""Generated sequences explained token by token (``explain --generate`` / ``--target``), checked against
transformers' own forward and autograd on tiny random decoders and encoder-decoders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnaudit.errors import AttnAuditError
from attnaudit.explain.generation import Generated, word_indices
from attnaudit.explain.text import explain_text
from attnaudit.hf import load_hf
from attnaudit.progress import set_quiet

set_quiet(True)

PROMPT = "the film was very good"


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from attnaudit.architectures import save_tiny

    return save_tiny("llama", tmp_path_factory.mktemp("gen") / "llama")


def teacher_forced(hf: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """Next-token distributions of transformers' eager forward at every position of ``ids``."""
    hf.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            return hf(input_ids=torch.tensor([ids])).logits[0].softmax(-1)
    finally:
        hf.set_attn_implementation("attnaudit")


def test_greedy_generation_matches_transformers_and_each_step_is_its_distribution(llama: Path) -> None:
    generated = explain_text(str(llama), PROMPT, methods=["attention", "gradient"], generate=4)
    assert isinstance(generated, Generated)
    model = load_hf(str(llama), device="cpu").model
    prompt = model.tokenizer(PROMPT)["input_ids"]
    ids = [step["id"] for step in generated.steps]
    model.hf.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            theirs = model.hf.generate(torch.tensor([prompt]), max_new_tokens=len(ids), do_sample=False, min_new_tokens=len(ids))
    finally:
        model.hf.set_attn_implementation("attnaudit")
    assert ids == theirs[0, len(prompt) :].tolist()
    probs = teacher_forced(model.hf, prompt + ids)
    for t, step in enumerate(generated.steps):
        row = probs[len(prompt) + t - 1]
        assert step["probability"] == pytest.approx(float(row[ids[t]]), abs=1e-5)
        assert step["entropy"] == pytest.approx(float(-(row * row.log()).sum()), abs=1e-4)
        assert [item["position"] for item in generated.items[t]] == list(range(len(prompt) + t))
        assert len(generated.scores["gradient"][t]) == len(prompt) + t
    frame = generated.frame()
    assert set(frame["side"]) == {"source", "target"} and len(frame) == 2 * sum(len(i) for i in generated.items)


def test_a_forced_token_is_explained_as_written_and_a_contrast_as_a_difference(llama: Path) -> None:
    """input_gradient of step t is |Σ_d ∂z_y/∂e| of the forced token's logit (not the argmax's), and with a contrast
    of ∂(z_y − z_c); computed here with transformers' eager forward and autograd."""
    model = load_hf(str(llama), device="cpu").model
    tokenizer = model.tokenizer
    target, contrast = " bad film", " good movie"
    forced = explain_text(str(llama), PROMPT, methods=["input_gradient"], target=target)
    contrasted = explain_text(str(llama), PROMPT, methods=["input_gradient"], target=target, contrast=contrast)
    prompt = tokenizer(PROMPT)["input_ids"]
    ys = tokenizer(target, add_special_tokens=False)["input_ids"]
    cs = tokenizer(contrast, add_special_tokens=False)["input_ids"]
    model.hf.set_attn_implementation("eager")
    try:
        for t, (y, c) in enumerate(zip(ys, cs)):
            ids = torch.tensor([prompt + ys[:t]])
            for result, foil in ((forced, None), (contrasted, c)):
                embeddings = model.hf.get_input_embeddings()(ids).detach().requires_grad_(True)
                logits = model.hf(inputs_embeds=embeddings).logits[0, -1]
                score = logits[y] - (logits[foil] if foil is not None else 0)
                (grad,) = torch.autograd.grad(score, embeddings)
                expected = grad[0].sum(-1).abs()
                assert result.scores["input_gradient"][t] == pytest.approx(expected.tolist(), rel=1e-4, abs=1e-6)
    finally:
        model.hf.set_attn_implementation("attnaudit")
    assert [s["id"] for s in forced.steps] == ys and [s["contrast_id"] for s in contrasted.steps] == cs
    assert contrasted.meta["explained"] == "p(target token) - p(contrast token)"


def test_the_text_reaches_the_tokenizer_as_written(llama: Path) -> None:
    text = "the film\nwas  very\tgood"
    generated = explain_text(str(llama), text, methods=["attention"], generate=1)
    single = explain_text(str(llama), text, methods=["attention"])
    tokenizer = load_hf(str(llama), device="cpu").model.tokenizer
    assert single.token_ids == tokenizer(text)["input_ids"]
    assert [item["position"] for item in generated.items[0]] == list(range(len(single.token_ids)))


@pytest.mark.parametrize("family", ["bart", "t5"])
def test_an_encoder_decoder_explains_each_target_token_over_the_source(family: str, tmp_path: Path) -> None:
    """Each step's probability is transformers' teacher-forced one, and leave-one-out is the total-variation
    change of that step's distribution when one source token is removed (recomputed with HF's forward)."""
    from attnaudit.architectures import save_tiny

    folder = save_tiny(family, tmp_path / family)
    generated = explain_text(str(folder), PROMPT, target="a good", methods=["attention", "loo", "gradient"])
    model = load_hf(str(folder), device="cpu").model
    tokenizer = model.tokenizer
    source = tokenizer(PROMPT)["input_ids"]
    ys = tokenizer(text_target="a good", add_special_tokens=False)["input_ids"]

    def distribution(ids: list[int], t: int) -> torch.Tensor:
        with torch.no_grad():
            logits = model.hf(input_ids=torch.tensor([ids]), decoder_input_ids=torch.tensor([[model.decoder_start, *ys[:t]]])).logits
        return logits[0, -1].softmax(-1)

    assert [s["id"] for s in generated.steps] == ys
    for t, step in enumerate(generated.steps):
        full = distribution(source, t)
        assert step["probability"] == pytest.approx(float(full[ys[t]]), abs=1e-6)
        sides = [item["side"] for item in generated.items[t]]
        assert sides == ["source"] * len(source) + ["target"] * t  # the earlier target tokens follow the source
        assert [item["token"] for item in generated.items[t][len(source):]] == [tokenizer.decode([y]) for y in ys[:t]]
        removed = [0.5 * float((distribution(source[:j] + source[j + 1 :], t) - full).abs().sum()) for j in range(len(source))]
        assert generated.scores["loo"][t][: len(source)] == pytest.approx(removed, abs=1e-5)
        assert all(v != v for v in generated.scores["loo"][t][len(source):])  # leave-one-out scores the source only: NaN
        with torch.no_grad():
            out = model.hf(input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor([[model.decoder_start, *ys[:t]]]),
                           output_attentions=True)
        cross, own = out.cross_attentions[-1][0, :, -1].mean(0), out.decoder_attentions[-1][0, :, -1].mean(0)
        assert generated.scores["attention"][t] == pytest.approx(cross.tolist() + own[1:].tolist(), abs=1e-6)
    greedy = explain_text(str(folder), PROMPT, generate=2, methods=["attention"])
    assert isinstance(greedy, Generated) and 1 <= len(greedy.target) <= 2
    with pytest.raises(AttnAuditError, match="give --generate N or --target TEXT"):
        explain_text(str(folder), PROMPT)


@pytest.mark.parametrize("family", ["t5", "marian"])
def test_gradients_reach_the_earlier_target_tokens_of_an_encoder_decoder(family: str, tmp_path: Path) -> None:
    """input × gradient's L2 scores of a step, source then earlier target tokens, against autograd through transformers'
    own forward given both sides' input embeddings (the decoder's: its embedding module's output, as the model makes it)."""
    from attnaudit.architectures import save_tiny

    folder = save_tiny(family, tmp_path / family)
    options = {"reduction": "l2", "score": "probability"}
    generated = explain_text(str(folder), PROMPT, target="a good film", methods=["input_gradient"], options=options)
    model = load_hf(str(folder), device="cpu").model
    hf, tokenizer = model.hf, model.tokenizer
    source = tokenizer(PROMPT)["input_ids"]
    ys = tokenizer(text_target="a good film", add_special_tokens=False)["input_ids"]
    decoder = hf.get_decoder()
    scale = float(getattr(decoder, "embed_scale", 1.0) or 1.0)  # Marian scales the module's output inside the decoder
    hf.set_attn_implementation("eager")
    try:
        for t in range(len(ys)):
            src = hf.get_encoder().get_input_embeddings()(torch.tensor([source])).detach().requires_grad_(True)
            tgt = decoder.get_input_embeddings()(torch.tensor([[model.decoder_start, *ys[:t]]])).detach().requires_grad_(True)
            probs = hf(inputs_embeds=src, decoder_inputs_embeds=tgt * scale).logits[0, -1].softmax(-1)
            grad_src, grad_tgt = torch.autograd.grad(probs[ys[t]], [src, tgt])
            expected = grad_src[0].norm(dim=-1).tolist() + grad_tgt[0, 1:].norm(dim=-1).tolist()
            assert generated.scores["input_gradient"][t] == pytest.approx(expected, rel=1e-4, abs=1e-7)
    finally:
        hf.set_attn_implementation("attnaudit")


def test_sampling_is_seeded_and_words_merge_their_pieces(llama: Path) -> None:
    runs = [explain_text(str(llama), PROMPT, methods=["attention"], generate=3, sample=True, seed=s) for s in (1, 1, 2)]
    assert runs[0].target == runs[1].target
    assert runs[0].meta["mode"] == "sampled"
    assert word_indices(["The", " capital", " of", "Fr", "ance", "\n", "\n", "The"]) == [0, 1, 2, 2, 2, 3, 4, 5]
    generated = runs[0]
    words = generated.words("max")
    assert set(words["aggregation"]) == {"max"} and len(words) <= len(generated.frame())


def test_cli_writes_the_files_and_refuses_bad_sequences_in_one_line(llama: Path, tmp_path: Path) -> None:
    from tests.reliability.helpers import cli

    out = tmp_path / "gen"
    result = cli("explain", "--hf", str(llama), "--text", PROMPT, "--generate", "2", "--method", "attention,gradient",
                  "--aggregate", "sum", "--out", str(out))
    assert result.returncode == 0, result.stderr
    data = json.loads((out / "generation.json").read_text())
    assert len(data["steps"]) == len(data["target"]) and set(data["scores"]) == {"attention", "gradient"}
    assert (out / "generation.csv").exists() and (out / "generation-words.csv").exists() and (out / "generation-gradient.png").exists()
    bad = {
        ("--text", "", "--generate", "2"): "--text is empty",
        ("--text", PROMPT, "--generate", "0"): "--generate must be at least 1",
        ("--text", PROMPT, "--generate", "2", "--target", "good"): "not both",
        ("--text", PROMPT, "--target", "zzzunknownword"): "cannot encode",
        ("--text", PROMPT, "--target", " good film", "--contrast", " bad"): "as many tokens",
        ("--text", PROMPT, "--contrast", " bad"): "--contrast needs",
        ("--text", PROMPT, "--generate", "2", "--aggregate", "median"): "--aggregate must be one of",
    }
    for args, message in bad.items():
        target = tmp_path / "bad"
        result = cli("explain", "--hf", str(llama), *args, "--out", str(target))
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert not target.exists()


@pytest.mark.parametrize(("family", "segments"), [("marian", None), ("t5", "word")])
def test_an_encoder_decoders_steps_in_one_batch_equal_each_step_alone(family: str, segments: str | None, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Every method that applies scores an encoder-decoder's steps in one batch (right-padded decoder prefixes, each row
    read at its last real target position) as it scores each step alone, items too; random draws per batch, so it is left out."""
    from attnaudit.architectures import save_tiny
    from attnaudit.explain import generation
    from attnaudit.explain.registry import EXPLANATIONS

    run = load_hf(str(save_tiny(family, tmp_path / family)), device="cpu")
    with run.model.forced_decision():  # what applies to the next-token decision after a forced target prefix
        names = [n for n, m in EXPLANATIONS.items() if n != "random" and m.applies(run.model) is None]
    assert {"attention", "gradient", "ig", "loo", "norms", "shapley"} <= set(names)
    together = explain_text(run, PROMPT, methods=names, generate=3, steps=8, segments=segments)
    one_by_one = generation.step_batches
    monkeypatch.setattr(generation, "step_batches", lambda *a, **k: one_by_one(*a, **{**k, "together": False}))
    alone = explain_text(run, PROMPT, methods=names, generate=3, steps=8, segments=segments)
    assert isinstance(together, Generated) and isinstance(alone, Generated)
    assert together.items == alone.items and together.steps == alone.steps
    for name in names:
        for mine, theirs in zip(together.scores[name], alone.scores[name], strict=True):
            assert torch.tensor(mine) == pytest.approx(torch.tensor(theirs), abs=1e-5, nan_ok=True), name


@pytest.mark.parametrize("family", ["llama", "gpt2", "phi3", "marian", "t5"])
def test_attention_on_generated_tokens_reads_the_rows_the_generation_made(family: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``attention`` on generated tokens runs no pass of its own: the generation kept each step's row of every layer
    (a decoder's prompt's last token, then each generated one, run alone with transformers' ``output_attentions``; an
    encoder-decoder's decoder steps and its encoder's matrices), and they equal the rows of a fresh pass over the steps
    (``rows_forward``) with the same tokens."""
    from attnaudit.architectures import save_tiny
    from attnaudit.models.hf.model import HFModel

    run = load_hf(str(save_tiny(family, tmp_path / family)), device="cpu")
    passes: list[int] = []
    decode = HFModel.decode
    monkeypatch.setattr(HFModel, "decode", lambda self, *a, **k: passes.append(1) or decode(self, *a, **k))
    kept = explain_text(run, PROMPT, methods=["attention"], generate=4)
    assert passes == [] and run.model._generated is not None
    monkeypatch.setattr(HFModel, "_generated_rows", lambda self, batch: None)
    fresh = explain_text(run, PROMPT, methods=["attention"], generate=4)
    assert passes == [1]  # the one pass over the steps (a decoder's longest, an encoder-decoder's batch of every step)
    assert isinstance(kept, Generated) and isinstance(fresh, Generated) and kept.target == fresh.target and kept.items == fresh.items
    for mine, theirs in zip(kept.scores["attention"], fresh.scores["attention"], strict=True):
        assert mine == pytest.approx(theirs, abs=1e-6)
    run.model._generated = None
    monkeypatch.undo()
    gradient = explain_text(run, PROMPT, methods=["gradient"], generate=2)  # no method reads rows: none are kept
    assert isinstance(gradient, Generated) and run.model._generated is None
