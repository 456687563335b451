"""Kobayashi et al. (2021)'s attention + residual + layer-norm norms: a closed form on a Transformer with
identity value/output maps, the token-by-token definition on our Transformer and a tiny BERT, and the
pre-LN decomposition of a tiny Llama against Hugging Face's own forward."""

from __future__ import annotations

import pytest
import torch

import attnaudit.explain.helpers.residual as residual_module
from attnaudit.data.types import Batch
from attnaudit.explain import EXPLANATIONS
from attnaudit.explain.helpers.residual import attention_block_parts
from attnaudit.explain.methods.norms_res_ln import norms_res_ln
from attnaudit.models import ModelConfig, build_model

from .plain import explanation_row, plain_layers, run_layer, shares, tiny_llama


def test_identity_value_output_maps_give_weight_times_centred_norm_over_the_spread() -> None:
    """With ``W_V = W_O = I``, no biases, one head and ``γ = 1``: ``‖T_i(x_j)‖ = (α_ij + δ_ij) ‖x_j − x̄_j‖ / s_i``,
    ``s_i`` the spread of ``x_i + Σ_k α_ik x_k``."""
    torch.manual_seed(3)
    config = ModelConfig(model="transformer", task_type="classification", vocab_size=12, num_labels=2,
                         embed_dim=8, d_model=8, heads=1, layers=1, d_ff=8, dropout=0.0)
    model = build_model(config).eval()
    block = model.layers[0]
    with torch.no_grad():
        for proj in (block.v_proj, block.out_proj):
            proj.weight.copy_(torch.eye(8))
            proj.bias.zero_()
        block.attention_norm.weight.fill_(1.0)
    tokens = torch.tensor([[3, 4, 5, 6], [7, 8, 0, 0]])
    batch = Batch(tokens=tokens, mask=tokens > 0)
    ours = norms_res_ln(model, batch)
    with torch.no_grad():
        record = model(batch).trace[0]
    for b in range(2):
        n = int(batch.mask[b].sum())
        x, a = record.inputs[b, :n], record.weights[b, 0, :n, :n]
        spread = torch.sqrt((x + a @ x).var(-1, unbiased=False) + block.attention_norm.eps)
        centred = (x - x.mean(-1, keepdim=True)).norm(dim=-1)
        expected = ((a + torch.eye(n)) * centred[None, :] / spread[:, None]).mean(0)
        torch.testing.assert_close(ours[b, :n], expected, atol=1e-6, rtol=1e-5)
        assert (ours[b, n:] == 0).all()


def test_norms_res_ln_equals_the_definition_computed_token_by_token(encoder: tuple) -> None:
    run, batch = encoder
    model = run.model
    ours = norms_res_ln(model, batch)
    with torch.no_grad():
        last = model(batch).trace[-1].inputs
    layer = plain_layers(model)[-1]
    for b in range(len(batch)):
        n = int(batch.mask[b].sum())
        x = last[b, :n]
        norms = shares(layer, x, run_layer(layer, x)).norm(dim=-1)
        torch.testing.assert_close(ours[b, :n], explanation_row(model, norms), atol=1e-5, rtol=1e-4)


def test_pre_rmsnorm_llama_shares_add_up_to_hfs_residual_stream_after_attention(tiny_hf) -> None:
    """Pre-LN: ``Σ_j T_i(x_j) (+ b_O) = x_i + attn(norm(x))_i``, read from HF's own forward at the input
    of each layer's ``post_attention_layernorm``; future tokens get nothing."""
    model, reference, batch = tiny_llama(tiny_hf)
    with torch.no_grad():
        trace = model(batch).trace
        parts = [attention_block_parts(model, record, layer) for layer, record in enumerate(trace.layers)]
    assert model.residual_norms(0).placement == "pre" and not model.residual_norms(0).attention_norm.centred
    for b in range(len(batch)):
        n = int(batch.mask[b].sum())
        seen: list[torch.Tensor] = []
        hooks = [layer.post_attention_layernorm.register_forward_pre_hook(lambda _m, args, seen=seen: seen.append(args[0][0]))
                 for layer in reference.model.layers]
        try:
            with torch.no_grad():
                reference(input_ids=batch.tokens[b : b + 1, :n])
        finally:
            for hook in hooks:
                hook.remove()
        for layer, stream in enumerate(seen):
            torch.testing.assert_close(parts[layer][b, :n, :n].sum(1), stream, atol=1e-5, rtol=1e-4)
            assert (parts[layer][b, :n, :n].norm(dim=-1).triu(1) == 0).all()


def test_examples_taken_one_at_a_time_give_the_same_scores(encoder: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shares are built a few examples at a time (``ELEMENTS``); one at a time changes nothing."""
    run, batch = encoder
    methods = [EXPLANATIONS[name] for name in ("norms_res_ln", "globenc", "alti")]
    whole = [method(run, batch) for method in methods]
    monkeypatch.setattr(residual_module, "ELEMENTS", 1)
    for method, expected in zip(methods, whole):
        torch.testing.assert_close(method(run, batch), expected, atol=1e-6, rtol=1e-5, msg=method.name)
