"""Value Zeroing against Mohebbi et al. (2023)'s definition: every (layer, token) zeroed in a plain
forward of our Transformer and a tiny BERT (tests/explain/plain.py), and in Hugging Face's own forward
of a tiny Llama (pre-RMSNorm decoder) with the value projection's output zeroed by a hook."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import spatial

import attnaudit.explain.methods.value_zeroing as value_zeroing_module
from attnaudit.explain.methods.value_zeroing import value_zeroing

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


@pytest.mark.parametrize("family", ["llama", "gemma2", "phi", "bert"])
def test_the_layer_decomposition_re_adds_to_each_layout_s_output(family: str) -> None:
    """Pre-norm, sandwich norms, parallel attention + MLP and post-norm blocks: the layer's output rebuilt from
    the attention block's summed input (``layer_output``) is the block's recorded output, and the shares of the
    attention block sum to what enters the feed-forward residual (pre/sandwich/parallel: ``h_i`` up to constants)."""
    from attnaudit.architectures import SENTENCES, build_tiny
    from attnaudit.data.types import Batch
    from attnaudit.explain.helpers.residual import attention_block_parts, residual_parts
    from attnaudit.models.hf import HFModel

    hf, tokenizer = build_tiny(family, "classifier" if family == "bert" else "lm")
    model = HFModel(hf.double(), tokenizer, "classification", family, trained_head=False)  # float64: exact sums
    encoded = tokenizer(list(SENTENCES[:2]), padding=True, return_tensors="pt")
    batch = Batch(tokens=encoded["input_ids"], mask=encoded["attention_mask"].bool(), examples=[])
    with torch.no_grad():
        trace = model(batch).trace
        for layer, record in enumerate(trace.layers):
            norms = model.residual_norms(layer)
            _, whole = residual_parts(model, record, layer)
            x = model.residual_stream(record)
            rebuilt = value_zeroing_module.layer_output(norms, whole.flatten(0, 1), x.flatten(0, 1)).view_as(whole)
            real = batch.mask[..., None]
            torch.testing.assert_close(rebuilt * real, record.outputs * real, atol=1e-6, rtol=1e-5)  # RMSNorms compute in float32 even here
            if norms.placement != "post":
                shares = attention_block_parts(model, record, layer).sum(2)
                expected = x + (whole - x if norms.post_norms is None else norms.post_norms[0](whole - x))
                constant = norms.output_bias if norms.placement != "sandwich" and norms.output_bias is not None else 0.0
                torch.testing.assert_close((shares + constant) * real, expected * real, atol=1e-6, rtol=1e-5)  # RMSNorms compute in float32 even here


@pytest.mark.parametrize("family", ["gemma2", "phi", "cohere"])
def test_value_zeroing_on_sandwich_and_parallel_blocks_equals_hf_with_a_zeroed_value(family: str) -> None:
    """Gemma 2 (sandwich norms), Phi and Cohere (parallel attention + MLP): each layer's map equals the cosine
    distances of HF's own layer outputs with one token's value zeroed by a hook on its value projection."""
    from attnaudit.architectures import build_tiny
    from attnaudit.data.types import Batch
    from attnaudit.explain.methods.value_zeroing import zeroing_map
    from attnaudit.models.hf import HFModel

    hf, tokenizer = build_tiny(family, "lm")
    reference, _ = build_tiny(family, "lm")
    model = HFModel(hf.double(), tokenizer, "classification", family, trained_head=False)
    reference.double()
    ids = tokenizer("the film was very good", return_tensors="pt")["input_ids"]
    batch = Batch(tokens=ids, mask=torch.ones_like(ids, dtype=torch.bool), examples=[])
    blocks = [m for m in reference.modules() if type(m) is type(model.layers[0])]

    def outputs(zero: tuple[int, int] | None = None) -> list[torch.Tensor]:
        seen: list[torch.Tensor] = []
        hooks = [block.register_forward_hook(lambda _m, _a, out: seen.append(out[0] if isinstance(out, tuple) else out)) for block in blocks]
        if zero is not None:
            value = dict(reference.named_modules())[next(n for n, m in model.hf.named_modules() if m is model.attention_projections(zero[0])[0])]

            def zeroing(_m, _a, out):  # noqa: ANN001, ANN202
                out = out.clone()
                out[:, zero[1]] = 0.0
                return out

            hooks.append(value.register_forward_hook(zeroing))
        try:
            with torch.no_grad():
                reference(input_ids=ids)
        finally:
            for hook in hooks:
                hook.remove()
        return [o[0] for o in seen]

    n = ids.shape[1]
    original = outputs()
    with torch.no_grad():
        trace = model(batch).trace
        for layer, record in enumerate(trace.layers):
            ours = zeroing_map(model, record, layer)[0]
            zeroed = [outputs((layer, j))[layer] for j in range(n)]
            expected = torch.tensor([[cosine_distance(original[layer][i], zeroed[j][i]) for j in range(n)] for i in range(n)], dtype=torch.float64)
            causal = torch.ones(n, n, dtype=torch.bool).tril()
            torch.testing.assert_close(ours[causal], expected.clamp_min(0)[causal], atol=1e-7, rtol=1e-5)


def test_value_zeroing_in_float32_equals_float64(encoder: tuple) -> None:
    """A random BERT's distances (~1e-6) are below float32's resolution of ``1 − cos`` from a dot product;
    taken as ``‖â − b̂‖² / 2`` they keep their digits, so the float32 scores equal the float64 ones."""
    run, batch = encoder
    with torch.no_grad():
        single = value_zeroing(run.model, batch)
        with float64(run.model):
            double = value_zeroing(run.model, batch)
    torch.testing.assert_close(single.double(), double, atol=1e-5 * float(double.abs().max()), rtol=1e-4)


@given(st.integers(0, 2**31 - 1), st.floats(1e-6, 1.0), st.integers(2, 64))
@settings(max_examples=50, deadline=None)
def test_cosine_distance_is_one_minus_cosine(seed: int, scale: float, width: int) -> None:
    """The same number as ``1 − cos`` (scipy's cosine distance); in float32 within 0.1 % of it for vectors
    as nearly parallel as 10⁻³ apart, where ``1 − cos`` from the float32 dot product can be off by 10 %."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(width, generator=g).double()
    b = (a + scale * torch.randn(width, generator=g, dtype=torch.float64)).float().double()  # both exact in float32
    reference = spatial.distance.cosine(a.numpy(), b.numpy())
    assert float(value_zeroing_module.cosine_distance(a, b)) == pytest.approx(reference, rel=1e-9, abs=1e-15)
    if scale >= 1e-3:
        assert float(value_zeroing_module.cosine_distance(a.float(), b.float())) == pytest.approx(reference, rel=1e-3)
