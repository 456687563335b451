"""Rollout read at the explanation query against the product of adjusted attention written out by hand."""

from __future__ import annotations

import torch

from attnaudit.explain.methods.attention_rollout import rollout_importance


def test_rollout_is_the_product_of_half_identity_plus_half_attention(runs: dict) -> None:
    run, batch = runs["transformer"]
    model = run.model.eval()
    rolled = rollout_importance(run, batch)
    with torch.no_grad():
        trace = model(batch).trace
    for b in range(len(batch)):
        n = int(batch.mask[b].sum())
        product = torch.eye(n)
        for layer in trace.layers:
            mixed = 0.5 * torch.eye(n) + 0.5 * layer.weights[b, :, :n, :n].mean(0)
            product = mixed @ product
        expected = product.mean(0)  # our Transformer pools the mean: the mean over real query rows
        torch.testing.assert_close(rolled[b, :n], expected, atol=1e-5, rtol=1e-4)
        assert (rolled[b, n:] == 0).all()
    torch.testing.assert_close(rolled.sum(-1), torch.ones(len(batch)), atol=1e-5, rtol=0)
