"""GlobEnc against Modarressi et al. (2022)'s definition computed token by token from a plain forward
(tests/explain/plain.py): the attention block's shares carried through the second residual and layer
norm (FFN counted only in that norm's scale), norms, rows normalised, rolled out."""

from __future__ import annotations

import torch

from attnaudit.explain.methods.globenc import globenc

from .plain import explanation_row, gelu, linear, plain_layers, rolled, run_layer, shares


def test_globenc_equals_the_definition_computed_token_by_token(encoder: tuple) -> None:
    run, batch = encoder
    model = run.model
    ours = globenc(model, batch)
    with torch.no_grad():
        states = model.encode(batch).states
    for b in range(len(batch)):
        n = int(batch.mask[b].sum())
        x, maps = states[b, :n], []
        for layer in plain_layers(model):
            out = run_layer(layer, x)
            t = shares(layer, x, out)
            second = out.h + linear(gelu(linear(out.h, layer.ff1)), layer.ff2)
            gamma, _, eps = layer.ln2
            n_ij = torch.zeros(n, n)
            for i in range(n):
                scale = torch.sqrt(second[i].var(unbiased=False) + eps)
                for j in range(n):
                    n_ij[i, j] = (gamma * (t[i, j] - t[i, j].mean()) / scale).norm()
            maps.append(n_ij)
            x = out.out
        torch.testing.assert_close(ours[b, :n], explanation_row(model, rolled(maps)), atol=1e-5, rtol=1e-4)
        assert (ours[b, n:] == 0).all()
    torch.testing.assert_close(ours.sum(-1), torch.ones(len(batch)), atol=1e-5, rtol=0)
