"""Integrated Gradients: completeness (signed attributions sum to f(x) − f(0)) on every family."""

from __future__ import annotations

import pytest
import torch

from attnaudit.errors import AttnAuditError
from attnaudit.explain.ig import integrated_gradients


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
