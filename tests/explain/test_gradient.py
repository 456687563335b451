"""Jain & Wallace's gradient against hand-written autograd, and per instance."""

from __future__ import annotations

import pytest
import torch

from attnaudit.explain.gradient import gradient_importance


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
