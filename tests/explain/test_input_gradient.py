"""Abnar & Zuidema's input gradient against autograd of the predicted logit (or probability, each reduction), one instance at a time;
where a LayerNorm reads the embeddings first, the summed reductions are refused (their gradient sums to 0)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from attnaudit.errors import AttnAuditError
from attnaudit.explain import EXPLANATIONS
from attnaudit.explain.helpers.gradients import decision_gradient
from attnaudit.explain.methods.gradient import gradient_importance
from attnaudit.explain.methods.input_gradient import input_gradient
from attnaudit.hf import load_hf
from attnaudit.models import build_model

from .plain import tiny_llama


def projected(run, width: int = 24):  # type: ignore[no-untyped-def]
    """The run's Transformer with ``width``-wide token embeddings mapped to ``d_model`` by a projection (random
    weights): its embedding LayerNorm reads the projection, not the embeddings, so Σ_d ∂z/∂e is not 0."""
    torch.manual_seed(0)
    return build_model(replace(run.model.config, embed_dim=width)).eval()


def test_input_gradient_is_the_summed_gradient_of_the_predicted_logit(runs: dict) -> None:
    run, batch = runs["transformer"]
    model = projected(run)
    assert not model.embeddings_shift_invariant()
    ours = input_gradient(model, batch)
    for b in (0, 3, len(batch) - 1):
        alone = run.collate([batch.examples[b]])
        emb = model.embed(alone).detach().requires_grad_(True)
        logits = model(alone, embeddings=emb).logits[0]
        logits[logits.argmax()].backward()
        n = int(alone.mask.sum())
        torch.testing.assert_close(ours[b, :n], emb.grad[0, :n].sum(-1).abs(), atol=1e-6, rtol=1e-4)
        assert (ours[b, n:] == 0).all()
    assert not torch.allclose(ours, gradient_importance(model, batch))  # attention live, logit, no ·e: another method


def test_a_layernorm_on_the_embeddings_makes_the_summed_gradient_vanish(runs: dict, tiny_hf: SimpleNamespace) -> None:
    """LN(x + c·1) = LN(x), so Σ_d ∂z/∂e_{t,d} = 0 (autograd: within rounding of Σ_d |∂z/∂e|) where a LayerNorm reads
    the embeddings first (our Transformer without a projection, BERT): the registry refuses |Σ_d| and Σ_d there in
    one line and keeps l2; a pre-norm Llama (a residual stream) and a projected Transformer keep every reduction."""
    bert = load_hf(tiny_hf.dir, task=tiny_hf.task(), device="cpu")
    llama, _, llama_batch = tiny_llama(tiny_hf)
    cases = [(runs["transformer"][0].model, runs["transformer"][1], True), (bert.model, next(bert.batches(bert.data().test, 8)), True),
             (llama, llama_batch, False), (projected(runs["transformer"][0]), runs["transformer"][1], False)]  # (model, batch, LN first)
    method = EXPLANATIONS["input_gradient"]
    for model, batch, invariant in cases:
        assert model.embeddings_shift_invariant() is invariant
        _, grad = decision_gradient(model, batch)
        real = batch.mask.bool()
        ratio = grad.sum(-1).abs()[real] / grad.abs().sum(-1)[real]
        assert bool((ratio < 1e-5).all()) is invariant
        for reduction in ("abs_sum", "sum"):
            reason = method.applies(model, {"reduction": reduction})
            assert (reason is not None) is invariant
        assert method.applies(model, {"reduction": "l2"}) is None
        if invariant:
            refused = r"^explanation 'input_gradient' does not apply to this model: its input embeddings reach .* LayerNorms.*--reduction l2\)$"
            with pytest.raises(AttnAuditError, match=refused):
                method(model, batch)
            assert method(model, batch, reduction="l2").shape == batch.tokens.shape


def test_on_a_hugging_face_encoder_it_is_the_gradient_of_the_predicted_logit(tiny_hf: SimpleNamespace) -> None:
    run = load_hf(tiny_hf.dir, task=tiny_hf.task(), device="cpu")
    batch = next(run.batches(run.data().test, 8))
    model = run.model
    emb = model.embed(batch).detach().requires_grad_(True)
    logits = model(batch, embeddings=emb).logits
    logits.gather(1, logits.argmax(-1, keepdim=True)).sum().backward()
    expected = emb.grad.abs().norm(dim=-1) * batch.mask
    torch.testing.assert_close(input_gradient(run, batch, reduction="l2"), expected)


@pytest.mark.parametrize("score", ["probability", "logit"])
def test_reductions_and_scores_are_those_of_autograd(runs: dict, score: str) -> None:
    """``score="probability", reduction="l2"`` is ‖∂ŷ/∂e‖₂ per token (inseq's saliency before it normalises over
    tokens: |·| elementwise, then the L2 norm); ``sum`` is the signed Σ_d; with a contrast, s = v_ŷ − v_c."""
    run, batch = runs["transformer"]
    model = projected(run)  # a projection before the embedding LayerNorm: Σ_d of the gradient is not 0
    with torch.no_grad():
        predicted = model(batch).logits.argmax(-1)
    contrastive = replace(batch, contrast=1 - predicted)
    l2 = input_gradient(model, batch, reduction="l2", score=score)
    signed = input_gradient(model, batch, reduction="sum", score=score)
    versus = input_gradient(model, contrastive, reduction="sum", score=score)
    for b in (0, 3, len(batch) - 1):
        alone = run.collate([batch.examples[b]])
        n = int(alone.mask.sum())
        grads = []
        for foil in (None, int(1 - predicted[b])):
            emb = model.embed(alone).detach().requires_grad_(True)
            out = model(alone, embeddings=emb)
            values = (out.probs if score == "probability" else out.logits)[0]
            (values[int(predicted[b])] - (values[foil] if foil is not None else 0)).backward()
            grads.append(emb.grad[0, :n])
        torch.testing.assert_close(l2[b, :n], grads[0].abs().norm(dim=-1), atol=1e-7, rtol=1e-4)
        torch.testing.assert_close(signed[b, :n], grads[0].sum(-1), atol=1e-7, rtol=1e-4)
        torch.testing.assert_close(versus[b, :n], grads[1].sum(-1), atol=1e-6, rtol=1e-4)
        assert (l2[b, n:] == 0).all()
    default = input_gradient(model, batch)
    torch.testing.assert_close(default, input_gradient(model, batch, reduction="abs_sum", score="logit"))  # the defaults
    torch.testing.assert_close(default, input_gradient(model, batch, reduction="sum").abs())


def test_bad_names_are_one_line(runs: dict) -> None:
    run, batch = runs["transformer"]
    with pytest.raises(AttnAuditError, match=r"^unknown score 'logits'; did you mean 'logit'\? \(choose from probability, logit\)$"):
        input_gradient(run, batch, score="logits")
    with pytest.raises(AttnAuditError, match=r"^unknown reduction 'L1' \(choose from abs_sum, l2, sum\)$"):
        input_gradient(run, batch, reduction="L1")
