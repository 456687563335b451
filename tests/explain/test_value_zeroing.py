"""Value Zeroing against Mohebbi et al. (2023)'s definition: every (layer, token) zeroed in a plain
forward of our Transformer and a tiny BERT (tests/explain/plain.py), and in Hugging Face's own forward
of a tiny Llama (pre-RMSNorm decoder) with the value projection's output zeroed by a hook."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

import attnaudit.explain.value_zeroing as value_zeroing_module
from attnaudit.explain.value_zeroing import value_zeroing

from .plain import explanation_row, plain_layers, rolled, run_layer, tiny_llama


@contextmanager
def float64(model: torch.nn.Module) -> Iterator[None]:
    """The (shared) model in float64 for the duration; float32 -> float64 -> float32 is exact."""
    model.double()
    try:
        yield
    finally:
        model.float()


def cosine_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(1.0 - a @ b / (a.norm() * b.norm()))


def test_value_zeroing_equals_zeroing_each_token_in_a_plain_forward(encoder: tuple) -> None:
    """In float64: a random BERT's cosine distances are ~1e-6, below float32's resolution of 1 − cos."""
    run, batch = encoder
    model = run.model
    with float64(model), torch.no_grad():
        ours = value_zeroing(model, batch)
        states = model.encode(batch).states
        layers = plain_layers(model)
    for b in range(len(batch)):
        n = int(batch.mask[b].sum())
        x, maps = states[b, :n], []
        for layer in layers:
            out = run_layer(layer, x)
            zeroed = [run_layer(layer, x, zero=j).out for j in range(n)]
            maps.append(torch.tensor([[cosine_distance(out.out[i], zeroed[j][i]) for j in range(n)] for i in range(n)], dtype=torch.float64))
            x = out.out
        torch.testing.assert_close(ours[b, :n], explanation_row(model, rolled(maps)), atol=1e-5, rtol=1e-3)
        assert (ours[b, n:] == 0).all()


def hf_layer_outputs(reference: torch.nn.Module, ids: torch.Tensor, zero: tuple[int, int] | None = None) -> list[torch.Tensor]:
    """Each decoder layer's output for one unpadded example, from HF's own forward; ``zero=(layer, token)``
    zeroes that token's row of the layer's ``v_proj`` output (its value in every head)."""
    outputs: list[torch.Tensor] = []
    hooks = [layer.register_forward_hook(lambda _m, _a, out: outputs.append(out[0] if isinstance(out, tuple) else out))
             for layer in reference.model.layers]
    if zero is not None:
        def zeroing(_m, _a, out):  # noqa: ANN001, ANN202
            out = out.clone()
            out[:, zero[1]] = 0.0
            return out
        hooks.append(reference.model.layers[zero[0]].self_attn.v_proj.register_forward_hook(zeroing))
    try:
        with torch.no_grad():
            reference(input_ids=ids[None])
    finally:
        for hook in hooks:
            hook.remove()
    return [o[0] for o in outputs]


def test_value_zeroing_on_a_llama_equals_hf_forwards_with_a_zeroed_value(tiny_hf, monkeypatch: pytest.MonkeyPatch) -> None:
    """Also with the (query, zeroed key) pairs taken through the feed-forward map 8 at a time."""
    monkeypatch.setattr(value_zeroing_module, "ROWS", 8)
    model, reference, batch = tiny_llama(tiny_hf, torch.float64)
    ours = value_zeroing(model, batch)
    for b in range(len(batch)):
        n = int(batch.mask[b].sum())
        ids = batch.tokens[b, :n]
        original = hf_layer_outputs(reference, ids)
        maps = []
        for layer in range(len(original)):
            zeroed = [hf_layer_outputs(reference, ids, (layer, j))[layer] for j in range(n)]
            maps.append(torch.tensor([[cosine_distance(original[layer][i], zeroed[j][i]) for j in range(n)] for i in range(n)], dtype=torch.float64))
        expected = rolled([m.clamp_min(0) for m in maps])[n - 1]  # the last real token explains a decoder
        torch.testing.assert_close(ours[b, :n], expected, atol=1e-5, rtol=1e-3)
        assert (ours[b, n:] == 0).all()
