"""Integrated Gradients: completeness (signed attributions sum to f(x) − f(x')) on every family, from the zero
baseline and from a token's embedding, for the probability and the logit; the L2 reduction against a hand-written integral;
the right Riemann rule with each step's gradient weighted by its place on the path (Madsen et al. 2022's) against a
hand-written sum."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from attnaudit.data.types import Batch
from attnaudit.data.vocab import Vocab
from attnaudit.errors import AttnAuditError
from attnaudit.explain import get_explanation
from attnaudit.explain.methods.ig import baseline_embeddings, integrated_gradients
from attnaudit.hf import load_hf


@pytest.mark.parametrize("family", ["bilstm", "cnn", "average", "transformer", "han", "pair-transformer"])
def test_integrated_gradients_completeness(runs: dict, family: str) -> None:
    """Signed IG attributions sum to f(x) − f(0) (zero passage embeddings)."""
    run, batch = runs[family]
    model = run.model.eval()
    signed = integrated_gradients(run, batch, steps=50, absolute=False)
    with torch.no_grad():
        probs = model(batch).probs
        pred = probs.argmax(-1, keepdim=True)
        emb = model.embed(batch)
        baseline = emb.clone()
        baseline[:, : batch.tokens.shape[1]] = 0  # the passage only: a pair Transformer's query stays
        f0 = model(batch, embeddings=baseline).probs.gather(1, pred)[:, 0]
    fx = probs.gather(1, pred)[:, 0]
    torch.testing.assert_close(signed.sum(1), fx - f0, atol=1e-3, rtol=0)
    absolute = integrated_gradients(model, batch, steps=50)
    if family == "han":  # |token| summed per sentence bounds |sentence sum|
        assert (absolute >= signed.abs() - 1e-7).all()
    else:
        torch.testing.assert_close(absolute, signed.abs())


def test_steps_must_be_positive(runs: dict) -> None:
    run, batch = runs["bilstm"]
    with pytest.raises(AttnAuditError, match="steps >= 1"):
        integrated_gradients(run, batch, steps=0)


def reference_value(model: torch.nn.Module, batch: Batch, embeddings: torch.Tensor, pred: torch.Tensor, score: str) -> torch.Tensor:
    out = model(batch, embeddings=embeddings)
    return (out.probs if score == "probability" else out.logits).gather(1, pred)[:, 0]


@pytest.mark.parametrize("family", ["bilstm", "transformer", "han", "pair-transformer"])
@pytest.mark.parametrize("score", ["probability", "logit"])
def test_completeness_from_the_unk_baseline(runs: dict, family: str, score: str) -> None:
    """``baseline="unk"``, ``reduction="sum"``: a row sums to f(x) − f(x') with x' every passage token's ``<unk>``
    embedding (a pair model's question unchanged), for the probability and the logit."""
    run, batch = runs[family]
    model = run.model.eval()
    signed = integrated_gradients(run, batch, steps=50, reduction="sum", score=score, baseline="unk")
    with torch.no_grad():
        pred = model(batch).probs.argmax(-1, keepdim=True)
        unk = replace(batch, tokens=torch.full_like(batch.tokens, Vocab.unk_id))
        reference = model.embed(batch).clone()
        t = batch.tokens.shape[1]
        reference[:, :t] = model.embed(unk)[:, :t]
        expected = reference_value(model, batch, model.embed(batch), pred, score) - reference_value(model, batch, reference, pred, score)
    torch.testing.assert_close(signed.sum(1), expected, atol=1e-3 if score == "probability" else 1e-2, rtol=0)


def test_l2_is_the_norm_of_a_hand_written_integral(runs: dict) -> None:
    """``reduction="l2"`` with the ``unk`` baseline (inseq's IG): ‖(e − e') ⊙ mean_α ∂ŷ/∂e(e' + α(e − e'))‖₂ per
    token, against a plain midpoint rule of 400 steps; ``abs_sum`` is the |Σ_d| of the same attributions."""
    run, batch = runs["transformer"]
    model = run.model.eval()
    ours = integrated_gradients(run, batch, steps=50, reduction="l2", baseline="unk")
    absolute = integrated_gradients(run, batch, steps=50, baseline="unk")
    with torch.no_grad():
        pred = model(batch).probs.argmax(-1, keepdim=True)
        x = model.embed(batch)
        x0 = model.embed(replace(batch, tokens=torch.full_like(batch.tokens, Vocab.unk_id)))
    total = torch.zeros_like(x)
    n = 400
    for k in range(n):
        point = (x0 + (k + 0.5) / n * (x - x0)).requires_grad_(True)
        (grad,) = torch.autograd.grad(model(batch, embeddings=point).probs.gather(1, pred).sum(), point)
        total += grad
    per_dim = (x - x0) * total / n * batch.mask[..., None]
    torch.testing.assert_close(ours, per_dim.norm(dim=-1), atol=2e-4, rtol=1e-2)
    torch.testing.assert_close(absolute, per_dim.sum(-1).abs(), atol=2e-4, rtol=1e-2)


@pytest.mark.parametrize(("family", "baseline"), [("bilstm", "zero"), ("transformer", "unk"), ("pair-transformer", "zero")])
def test_the_scale_weighted_right_riemann_sum_is_madsen_et_al_s(runs: dict, family: str, baseline: str) -> None:
    """``rule="riemann_right", weight="scale"``: ``1/n Σ_i α_i ∂z/∂e(e' + α_i(e − e')) · (e − e')``, ``α_i = i/n``, per
    token (``reduction="sum"``), against a hand-written loop; from zero that is Madsen et al. 2022's code, which takes
    the gradient with respect to the unscaled embedding. A pair model's question is not scaled."""
    run, batch = runs[family]
    model = run.model.eval()
    ours = integrated_gradients(run, batch, steps=10, reduction="sum", score="logit", baseline=baseline,
                                rule="riemann_right", weight="scale")
    t = batch.tokens.shape[1]
    with torch.no_grad():
        pred = model(batch).probs.argmax(-1, keepdim=True)
        e = model.embed(batch)
        start = e.clone()
        start[:, :t] = 0 if baseline == "zero" else model.embed(replace(batch, tokens=torch.full_like(batch.tokens, Vocab.unk_id)))[:, :t]
    total = torch.zeros_like(e)
    n = 10
    for i in range(1, n + 1):
        point = (start + i / n * (e - start)).requires_grad_(True)
        (grad,) = torch.autograd.grad(model(batch, embeddings=point).logits.gather(1, pred).sum(), point)
        total += i / n * grad / n
    expected = ((e - start) * total)[:, :t].sum(-1) * batch.mask
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-4)
    plain = integrated_gradients(run, batch, steps=10, reduction="sum", score="logit", baseline=baseline, rule="riemann_right")
    assert not torch.allclose(ours, plain, atol=1e-4)  # the weight changes the scores
    with pytest.raises(AttnAuditError, match=r"^unknown rule 'simpson' \(choose from gausslegendre, riemann_right, "):
        integrated_gradients(run, batch, steps=2, rule="simpson")
    with pytest.raises(AttnAuditError, match=r"^unknown weight 'alpha' \(choose from none, scale\)$"):
        integrated_gradients(run, batch, steps=2, weight="alpha")


def test_token_baselines_of_a_hugging_face_encoder(tiny_hf: SimpleNamespace) -> None:
    """An HF model's baseline is its tokenizer's token's input embedding, before positions and token types
    (added inside the model), the same vector at every position; completeness holds from it; a token the
    tokenizer lacks is a one-line error."""
    run = load_hf(tiny_hf.dir, task=tiny_hf.task(), device="cpu")
    model = run.model.eval()
    batch = next(run.batches(run.data().test, 8))
    table = model.hf.get_input_embeddings().weight
    tokenizer = model.tokenizer
    for name in ("unk", "pad", "mask"):
        vectors = baseline_embeddings(model, batch, name)
        torch.testing.assert_close(vectors, table[getattr(tokenizer, f"{name}_token_id")].expand_as(vectors))
    signed = integrated_gradients(run, batch, steps=50, reduction="sum", baseline="mask")
    with torch.no_grad():
        pred = model(batch).probs.argmax(-1, keepdim=True)
        fx = reference_value(model, batch, model.embed(batch), pred, "probability")
        f0 = reference_value(model, batch, baseline_embeddings(model, batch, "mask"), pred, "probability")
    torch.testing.assert_close(signed.sum(1), fx - f0, atol=1e-3, rtol=0)
    no_eos = r"^ig baseline 'eos': this model's tokenizer has no eos token; choose zero, unk, pad or mask$"
    with pytest.raises(AttnAuditError, match=no_eos):
        integrated_gradients(run, batch, steps=2, baseline="eos")


def test_bad_options_are_one_line(runs: dict) -> None:
    run, batch = runs["bilstm"]
    with pytest.raises(AttnAuditError, match=r"^unknown baseline 'unknown'; did you mean 'unk'\? \(choose from zero, unk, pad, mask, eos, delete\)$"):
        integrated_gradients(run, batch, steps=2, baseline="unknown")
    with pytest.raises(AttnAuditError, match="^ig: baseline 'delete' removes tokens .*; IG integrates from an embedding"):
        integrated_gradients(run, batch, steps=2, baseline="delete")  # the perturbation methods' removal
    with pytest.raises(AttnAuditError, match="this model's vocabulary has no mask token; choose zero, unk or pad$"):
        integrated_gradients(run, batch, steps=2, baseline="mask")
    with pytest.raises(AttnAuditError, match=r"^ig: baseline 'delete' removes tokens"):
        integrated_gradients(run, batch, steps=2, baseline="delete")
    with pytest.raises(AttnAuditError, match=r"^explanation 'ig' does not apply to this model: baseline 'delete' removes tokens"):
        get_explanation("ig")(run, batch, steps=2, baseline="delete")
    with pytest.raises(AttnAuditError, match=r"absolute=False is reduction='sum'; it does not combine with reduction='l2'"):
        integrated_gradients(run, batch, steps=2, absolute=False, reduction="l2")
    torch.testing.assert_close(integrated_gradients(run, batch, steps=4, absolute=False), integrated_gradients(run, batch, steps=4, reduction="sum"))


@pytest.mark.parametrize("family", ["transformer", "pair-transformer"])
def test_a_batch_of_mixed_lengths_gives_each_instance_its_own_scores(runs: dict, family: str) -> None:
    """IG runs groups of similar length without the others' padding: each row equals the instance explained
    alone (padding changes no real position's gradient), zero at its padding."""
    run, batch = runs[family]
    model = run.model.eval()
    together = integrated_gradients(model, batch, steps=8, reduction="sum")
    lengths = batch.mask.sum(1)
    assert len(set(lengths.tolist())) > 1  # the batch mixes lengths, so the groups differ
    for i in range(len(batch)):
        alone = integrated_gradients(model, batch.select(torch.tensor([i])), steps=8, reduction="sum")
        torch.testing.assert_close(together[i, : alone.shape[1]], alone[0], atol=1e-6, rtol=1e-5)
        assert (together[i, alone.shape[1] :] == 0).all()
