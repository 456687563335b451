"""DecompX against a literal, token-by-token propagation of the decomposition through a plain forward
(tests/explain/plain.py) of our Transformer and a tiny BERT, head included; its parts add up to the
predicted logit exactly; decoders (pre-norm) are refused with a reason."""

from __future__ import annotations

import math

import torch

from attnaudit.explain import EXPLANATIONS
from attnaudit.explain.methods.decompx import decompx
from attnaudit.models.transformer import TransformerEncoderModel

from .plain import gelu, plain_layers, tiny_llama


def absdot(parts: list[torch.Tensor], bias: torch.Tensor) -> list[torch.Tensor]:
    """``bias`` shared among ``parts`` in proportion to ``|⟨part, bias⟩|``."""
    weights = [abs(float(p @ bias)) for p in parts]
    total = sum(weights) + 1e-12
    return [p + w / total * bias for p, w in zip(parts, weights)]


def norm(parts: list[torch.Tensor], gamma: torch.Tensor, beta: torch.Tensor, eps: float) -> list[torch.Tensor]:
    whole = sum(parts)
    scale = torch.sqrt(whole.var(unbiased=False) + eps)
    return absdot([gamma * (p - p.mean()) / scale for p in parts], beta)


def dense(parts: list[torch.Tensor], weight: torch.Tensor, bias: torch.Tensor, act=None) -> list[torch.Tensor]:  # noqa: ANN001
    """``nn.Linear``-layout ``weight``; each part through it, bias shared, then ``act(z)/z`` of the whole."""
    parts = absdot([weight @ p for p in parts], bias)
    if act is None:
        return parts
    z = sum(parts)
    return [act(z) / z * p for p in parts]


def reference(model, x: torch.Tensor) -> list[torch.Tensor]:  # noqa: ANN001
    """Token k's part of each logit, propagated literally for one unpadded example ``x`` ``(n, d)``."""
    n, d = x.shape
    v = [[x[i] if i == k else torch.zeros(d) for k in range(n)] for i in range(n)]
    for number, layer in enumerate(plain_layers(model)):
        dh = d // layer.heads
        q, kk = x @ layer.q[0].T + layer.q[1], x @ layer.k[0].T + layer.k[1]
        alpha = [torch.softmax(q[:, h * dh:(h + 1) * dh] @ kk[:, h * dh:(h + 1) * dh].T / math.sqrt(dh), -1) for h in range(layer.heads)]
        # b_V travels with each token's own value in the first layer, is shared out with b_O after it
        bias = layer.o[1] if number == 0 else layer.o[0] @ layer.v[1] + layer.o[1]
        new = []
        for i in range(n):
            mixed = []
            for k in range(n):
                total = torch.zeros(d)
                for h in range(layer.heads):
                    cols = slice(h * dh, (h + 1) * dh)
                    for j in range(n):
                        value = layer.v[0][cols] @ v[j][k] + (layer.v[1][cols] if number == 0 and j == k else 0.0)
                        total = total + alpha[h][i, j] * (layer.o[0][:, cols] @ value)
                mixed.append(total + v[i][k])
            h1 = norm(absdot(mixed, bias), *layer.ln1)
            f = dense(dense(h1, *layer.ff1, act=gelu), *layer.ff2)
            new.append(norm([a + b for a, b in zip(h1, f)], *layer.ln2))
        v = new
        x = torch.stack([sum(row) for row in v])
    if isinstance(model, TransformerEncoderModel):
        pooled = [sum(v[i][k] for i in range(n)) / n for k in range(n)]
        return dense(pooled, model.classifier.weight.detach(), model.classifier.bias.detach())
    pooler, classifier = model.hf.bert.pooler.dense, model.hf.classifier
    pooled = dense(v[0], pooler.weight.detach(), pooler.bias.detach(), act=torch.tanh)
    return dense(pooled, classifier.weight.detach(), classifier.bias.detach())


def test_decompx_equals_the_literal_propagation_and_adds_up_to_the_logit(encoder: tuple) -> None:
    run, batch = encoder
    model = run.model
    ours = decompx(model, batch)
    with torch.no_grad():
        states, logits = model.encode(batch).states, model(batch).logits
    for b in range(len(batch)):
        n = int(batch.mask[b].sum())
        with torch.no_grad():
            parts = reference(model, states[b, :n])
        predicted = int(logits[b].argmax())
        torch.testing.assert_close(sum(parts), logits[b], atol=1e-4, rtol=1e-4)  # a decomposition: exact
        torch.testing.assert_close(ours[b, :n], torch.stack([p[predicted] for p in parts]), atol=1e-4, rtol=1e-3)
        torch.testing.assert_close(ours[b].sum(), logits[b, predicted], atol=1e-4, rtol=1e-4)
        assert (ours[b, n:] == 0).all()


def test_decompx_refuses_pre_norm_decoders_and_headless_models(tiny_hf, runs: dict) -> None:  # noqa: ANN001
    model, _, _ = tiny_llama(tiny_hf)
    assert "post-LN" in EXPLANATIONS["decompx"].applies(model)
    run, _ = runs["bilstm"]
    assert "no residual connections" in EXPLANATIONS["decompx"].applies(run)
