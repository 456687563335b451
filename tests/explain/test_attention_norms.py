"""The head-summed norm ‖Σ_h α^h f_h(x_j)‖ against the vectors summed explicitly, per query row."""

from __future__ import annotations

import torch

from attnaudit.explain.methods.attention_norms import norm_importance


def test_norms_equal_the_explicit_vector_sum(runs: dict) -> None:
    run, batch = runs["transformer"]
    model = run.model.eval()
    ours = norm_importance(run, batch)
    with torch.no_grad():
        layer = model.explained_layer % model.num_attention_layers
        record = model(batch).trace[layer]
        w_v, b_v, w_o, heads = model.value_output_maps(layer)
        dh = w_v.shape[1] // heads
        values = record.inputs @ w_v + b_v  # (B, K, H*dh)
        f = torch.stack([values[..., h * dh : (h + 1) * dh] @ w_o[h * dh : (h + 1) * dh] for h in range(heads)], 1)
        summed = torch.einsum("bhqk,bhkd->bqkd", record.weights, f).norm(dim=-1)  # (B, Q, K)
    real = batch.mask.bool()
    expected = (summed * real[:, :, None]).sum(1) / real.sum(1, keepdim=True) * real
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-4)
    assert (ours[:-1][real[:-1]] > 0).all()
