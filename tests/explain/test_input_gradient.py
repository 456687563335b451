"""Abnar & Zuidema's input gradient against autograd of the predicted logit, one instance at a time."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from attnaudit.explain.gradient import gradient_importance
from attnaudit.explain.input_gradient import input_gradient
from attnaudit.hf import load_hf


def test_input_gradient_is_the_summed_gradient_of_the_predicted_logit(runs: dict) -> None:
    run, batch = runs["transformer"]
    model = run.model.eval()
    ours = input_gradient(run, batch)
    for b in (0, 3, len(batch) - 1):
        alone = run.collate([batch.examples[b]])
        emb = model.embed(alone).detach().requires_grad_(True)
        logits = model(alone, embeddings=emb).logits[0]
        logits[logits.argmax()].backward()
        n = int(alone.mask.sum())
        torch.testing.assert_close(ours[b, :n], emb.grad[0, :n].sum(-1).abs(), atol=1e-6, rtol=1e-4)
        assert (ours[b, n:] == 0).all()
    assert not torch.allclose(ours, gradient_importance(run, batch))  # attention live, logit, no ·e: another method


def test_on_a_hugging_face_encoder_it_is_the_gradient_of_the_predicted_logit(tiny_hf: SimpleNamespace) -> None:
    run = load_hf(tiny_hf.dir, task=tiny_hf.task(), device="cpu")
    batch = next(run.batches(run.data().test, 8))
    model = run.model
    emb = model.embed(batch).detach().requires_grad_(True)
    logits = model(batch, embeddings=emb).logits
    logits.gather(1, logits.argmax(-1, keepdim=True)).sum().backward()
    expected = emb.grad.sum(-1).abs() * batch.mask
    torch.testing.assert_close(input_gradient(run, batch), expected)
