"""Chefer et al. (2021)'s gradient-weighted rollout against a hand autograd computation: the attention
of every layer recomputed in a plain forward (tests/explain/plain.py), the predicted logit backpropagated
by ``backward()`` to those tensors, and ``R ← R + mean_h (∇A ⊙ A)⁺ R`` written out."""

from __future__ import annotations

import math

import torch

from attnaudit.explain.methods.chefer import chefer

from .plain import explanation_row, head_logits, linear, plain_layers, run_layer


def plain_forward_keeping_attention(layers: list, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Final states and each layer's attention ``(H,n,n)``, with the attention kept as graph nodes whose
    gradients ``backward`` fills in; each layer's output is recomputed from that attention tensor."""
    attention = []
    for layer in layers:
        n, d = x.shape
        dh = d // layer.heads
        q, k, v = linear(x, layer.q), linear(x, layer.k), linear(x, layer.v)
        a = torch.stack([torch.softmax(q[:, h * dh:(h + 1) * dh] @ k[:, h * dh:(h + 1) * dh].T / math.sqrt(dh), -1)
                         for h in range(layer.heads)])
        a.retain_grad()
        attention.append(a)
        mixed = torch.cat([a[h] @ v[:, h * dh:(h + 1) * dh] for h in range(layer.heads)], -1)
        x = run_layer_from_mixed(layer, x, mixed)
    return x, attention


def run_layer_from_mixed(layer, x: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    from .plain import gelu, layer_norm

    h = layer_norm(x + linear(mixed, layer.o), layer.ln1)
    return layer_norm(h + linear(gelu(linear(h, layer.ff1)), layer.ff2), layer.ln2)


def test_chefer_equals_a_hand_autograd_computation(encoder: tuple) -> None:
    run, batch = encoder
    model = run.model
    ours = chefer(model, batch)
    with torch.no_grad():
        states = model.encode(batch).states
        logits = model(batch).logits
    layers = plain_layers(model)
    for b in range(len(batch)):
        n = int(batch.mask[b].sum())
        x0 = states[b, :n].clone().requires_grad_(True)
        with torch.enable_grad():
            final, attention = plain_forward_keeping_attention(layers, x0)
            mine = head_logits(model, final)
            torch.testing.assert_close(mine, logits[b], atol=1e-5, rtol=1e-4)  # the plain forward is the model
            mine[int(mine.argmax())].backward()
        relevance = torch.eye(n)
        for a in attention:
            weighted = (a.grad * a.detach()).clamp(min=0).mean(0)
            relevance = relevance + weighted @ relevance
        torch.testing.assert_close(ours[b, :n], explanation_row(model, relevance), atol=1e-5, rtol=1e-4)
        assert (ours[b, n:] == 0).all()


def test_plain_layers_reproduce_the_models_attention(encoder: tuple) -> None:
    """The reference forward of tests/explain/plain.py is the model: same attention in every layer."""
    run, batch = encoder
    model = run.model
    with torch.no_grad():
        trace, states = model(batch).trace, model.encode(batch).states
        for b in range(len(batch)):
            n = int(batch.mask[b].sum())
            x = states[b, :n]
            for layer, record in zip(plain_layers(model), trace.layers):
                out = run_layer(layer, x)
                torch.testing.assert_close(out.weights, record.weights[b, :, :n, :n], atol=1e-6, rtol=1e-5)
                torch.testing.assert_close(out.out, record.outputs[b, :n], atol=1e-5, rtol=1e-4)
                x = out.out
