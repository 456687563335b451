"""ALTI against the definition of Ferrando et al. (2022), computed token by token and layer by layer from
a plain forward (tests/explain/plain.py) of our Transformer and of a tiny BERT."""

from __future__ import annotations

import torch

from attnaudit.explain.methods.alti import alti

from .plain import explanation_row, plain_layers, rolled, run_layer, shares


def test_alti_equals_the_definition_computed_token_by_token(encoder: tuple) -> None:
    run, batch = encoder
    model = run.model
    ours = alti(model, batch)
    with torch.no_grad():
        states = model.encode(batch).states
    layers = plain_layers(model)
    for b in range(len(batch)):
        n = int(batch.mask[b].sum())
        x, maps = states[b, :n], []
        for layer in layers:
            out = run_layer(layer, x)
            t = shares(layer, x, out)
            gamma, beta, eps = layer.ln1
            bias = layer.o[1]
            # the decomposition is exact: the shares and the bias terms add up to LN1's output
            scale = torch.sqrt(out.pre.var(-1, unbiased=False, keepdim=True) + eps)
            torch.testing.assert_close(t.sum(1) + gamma * (bias - bias.mean()) / scale + beta, out.h, atol=1e-5, rtol=1e-4)
            y = t.sum(1)
            c = torch.tensor([[max(0.0, float(y[i].abs().sum() - (y[i] - t[i, j]).abs().sum())) for j in range(n)] for i in range(n)])
            maps.append(c)
            x = out.out
        torch.testing.assert_close(ours[b, :n], explanation_row(model, rolled(maps)), atol=1e-5, rtol=1e-4)
        assert (ours[b, n:] == 0).all()
