"""Jain & Wallace's gradient against hand-written autograd (each reduction and score), and per instance."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from attnaudit.errors import AttnAuditError
from attnaudit.explain.methods.gradient import gradient_importance


def test_gradient_matches_hand_written_autograd(runs: dict) -> None:
    """J&W's gradient written out by hand for the biLSTM classifier, one instance at a time."""
    run, batch = runs["bilstm"]
    model = run.model.eval()
    ours = gradient_importance(model, batch)
    for b in range(len(batch)):
        n = int(batch.mask[b].sum())
        tokens = batch.tokens[b : b + 1, :n]
        emb = model.embedding(tokens).detach().requires_grad_(True)
        states = model.encoder.rnn(emb)[0]
        scores = model.scorer(states[:, None])[:, 0, 0]
        alpha = scores.softmax(-1).detach()  # attention as a constant
        probs = model.output(alpha @ states[0]).softmax(-1)
        probs.max().backward()
        expected = (emb.grad * emb).sum(-1).abs()[0]
        torch.testing.assert_close(ours[b, :n], expected, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("family", ["transformer", "han", "pair-transformer"])
def test_gradient_is_per_instance(runs: dict, family: str) -> None:
    """Batched gradients equal gradients of each instance alone (no leakage through padding)."""
    run, batch = runs[family]
    ours = gradient_importance(run, batch)
    examples = batch.examples
    for b in (0, 3):
        alone = gradient_importance(run, run.collate([examples[b]]))
        k = alone.shape[1]
        torch.testing.assert_close(ours[b, :k], alone[0], atol=1e-6, rtol=1e-4)
        assert (ours[b, k:] == 0).all()


def hand_gradient(model: torch.nn.Module, tokens: torch.Tensor, score: str, contrast: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(∂s/∂e · e, e)`` per dimension for one biLSTM instance, attention a constant, ``s`` the predicted
    class's probability or logit (minus ``contrast``'s)."""
    emb = model.embedding(tokens).detach().requires_grad_(True)
    states = model.encoder.rnn(emb)[0]
    alpha = model.scorer(states[:, None])[:, 0, 0].softmax(-1).detach()
    logits = model.output(alpha @ states[0])[0]
    values = logits.softmax(-1) if score == "probability" else logits
    chosen = int(logits.argmax())
    s = values[chosen] - (values[contrast] if contrast is not None else 0)
    s.backward()
    return (emb.grad * emb)[0].detach(), emb[0].detach()


@pytest.mark.parametrize("score", ["probability", "logit"])
def test_reductions_and_scores_match_hand_written_autograd(runs: dict, score: str) -> None:
    """``reduction`` l2 is the norm of ∂s/∂e·e over the embedding, ``sum`` its signed sum; ``score``
    logit differentiates z_ŷ instead of ŷ; the defaults are the absolute sum of the probability's."""
    run, batch = runs["bilstm"]
    model = run.model.eval()
    l2 = gradient_importance(model, batch, reduction="l2", score=score)
    signed = gradient_importance(model, batch, reduction="sum", score=score)
    absolute = gradient_importance(model, batch, reduction="abs_sum", score=score)
    for b in range(len(batch)):
        n = int(batch.mask[b].sum())
        per_dim, _ = hand_gradient(model, batch.tokens[b : b + 1, :n], score)
        torch.testing.assert_close(l2[b, :n], per_dim.norm(dim=-1), atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(signed[b, :n], per_dim.sum(-1), atol=1e-6, rtol=1e-4)
        assert (l2[b, n:] == 0).all() and (signed[b, n:] == 0).all()
    torch.testing.assert_close(absolute, signed.abs())
    if score == "probability":
        torch.testing.assert_close(gradient_importance(model, batch), absolute)  # the defaults are unchanged
    else:
        assert not torch.allclose(absolute, gradient_importance(model, batch))


def test_contrast_with_the_logit(runs: dict) -> None:
    """A contrast class is subtracted from the logit as from the probability."""
    run, batch = runs["bilstm"]
    model = run.model.eval()
    with torch.no_grad():
        predicted = model(batch).logits.argmax(-1)
    contrastive = replace(batch, contrast=1 - predicted)
    ours = gradient_importance(model, contrastive, reduction="sum", score="logit")
    for b in (0, 3):
        n = int(batch.mask[b].sum())
        per_dim, _ = hand_gradient(model, batch.tokens[b : b + 1, :n], "logit", contrast=int(1 - predicted[b]))
        torch.testing.assert_close(ours[b, :n], per_dim.sum(-1), atol=1e-6, rtol=1e-4)


def test_bad_reduction_or_score_is_one_line(runs: dict) -> None:
    run, batch = runs["bilstm"]
    with pytest.raises(AttnAuditError, match=r"unknown reduction 'abs_summ'; did you mean 'abs_sum'\? \(choose from abs_sum, l2, sum\)"):
        gradient_importance(run, batch, reduction="abs_summ")
    with pytest.raises(AttnAuditError, match=r"unknown score 'prob' \(choose from probability, logit\)") as caught:
        gradient_importance(run, batch, score="prob")
    assert "\n" not in str(caught.value)
    torch.testing.assert_close(gradient_importance(run, batch, reduction="abs-sum"), gradient_importance(run, batch))  # - and _ alike


@pytest.mark.parametrize("score", ["probability", "logit"])
def test_live_attention_is_the_plain_input_times_gradient(runs: dict, score: str) -> None:
    """``attention="live"``: the gradient flows through the attention weights too (nothing detached), by hand; it differs
    from J&W's detached gradient wherever the attention depends on the input."""
    run, batch = runs["bilstm"]
    model = run.model.eval()
    live = gradient_importance(model, batch, score=score, attention="live")
    detached = gradient_importance(model, batch, score=score)
    for b in range(len(batch)):
        n = int(batch.mask[b].sum())
        emb = model.embedding(batch.tokens[b : b + 1, :n]).detach().requires_grad_(True)
        states = model.encoder.rnn(emb)[0]
        alpha = model.scorer(states[:, None])[:, 0, 0].softmax(-1)  # not detached
        logits = model.output(alpha @ states[0])[0]
        values = logits.softmax(-1) if score == "probability" else logits
        values[int(logits.argmax())].backward()
        torch.testing.assert_close(live[b, :n], (emb.grad * emb).sum(-1).abs()[0], atol=1e-6, rtol=1e-4)
    assert not torch.allclose(live, detached)
    with pytest.raises(AttnAuditError, match="unknown attention 'off'"):
        gradient_importance(model, batch, attention="off")
