"""Attention rollout (hand-computed cases, properties) and flow (against networkx)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from entmax import sparsemax
from hypothesis import given, settings
from hypothesis import strategies as st

from attnaudit.algorithms import attention_graph as F
from attnaudit.errors import AttnAuditError


def _layer(rows: list[list[float]]) -> torch.Tensor:
    """One single-head layer ``(1, 1, T, T)`` from a nested list."""
    return torch.tensor(rows, dtype=torch.float64)[None, None]


@st.composite
def attention(
    draw: st.DrawFn, max_t: int = 5, max_layers: int = 3, residuals: tuple = (0.0, 0.3, 0.5, 1.0)
) -> dict:
    """Random attention (softmax or sparse), a padding mask, a head fusion and a residual."""
    B = draw(st.integers(1, 2))
    H = draw(st.integers(1, 3))
    T = draw(st.integers(1, max_t))
    L = draw(st.integers(1, max_layers))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    norm = sparsemax if draw(st.booleans()) else torch.softmax
    atts = tuple(
        norm(3 * torch.randn(B, H, T, T, generator=g, dtype=torch.float64), dim=-1)
        for _ in range(L)
    )
    lengths = [draw(st.integers(1, T)) for _ in range(B)]
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    return {
        "attentions": atts,
        "head_fusion": draw(st.sampled_from(["mean", "max", "min"])),
        "residual": draw(st.sampled_from(residuals)),
        "mask": mask if draw(st.booleans()) else None,
    }


# ---------------------------------------------------------------- rollout


def test_rollout_two_layers_by_hand() -> None:
    a1 = _layer([[1.0, 0.0], [0.5, 0.5]])  # Â1 = [[1, 0], [.25, .75]]
    a2 = _layer([[0.0, 1.0], [1.0, 0.0]])  # Â2 = [[.5, .5], [.5, .5]]
    out = F.rollout((a1, a2), residual=0.5)
    assert out.shape == (1, 2, 2, 2)
    f64 = torch.float64
    torch.testing.assert_close(out[0, 0], torch.tensor([[1.0, 0.0], [0.25, 0.75]], dtype=f64))
    torch.testing.assert_close(out[0, 1], torch.tensor([[0.625, 0.375], [0.625, 0.375]], dtype=f64))


def test_head_fusions_by_hand() -> None:
    heads = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]], dtype=torch.float64)[None]
    expected = {
        "mean": [[0.75, 0.25], [0.25, 0.75]],  # ½I + ½·(½ ones)
        "max": [[2 / 3, 1 / 3], [1 / 3, 2 / 3]],  # ½I + ½ ones = [[1, .5], [.5, 1]], renormalised
        "min": [[1.0, 0.0], [0.0, 1.0]],  # ½I only, renormalised
    }
    for fusion, value in expected.items():
        out = F.adjusted_attention((heads,), head_fusion=fusion)  # type: ignore[arg-type]
        torch.testing.assert_close(out[0, 0], torch.tensor(value, dtype=torch.float64))


@settings(max_examples=40, deadline=None)
@given(attention(max_t=6, max_layers=4, residuals=(0.3, 0.5, 1.0)))
def test_rollout_rows_sum_to_one_and_match_matrix_product(case: dict) -> None:
    # residual > 0: with 0, min-fusion of sparse heads can leave a row with no weight at all
    out = F.rollout(**case)
    adj = F.adjusted_attention(**case).numpy()
    B, L, T, _ = adj.shape
    mask = case["mask"] if case["mask"] is not None else torch.ones(B, T, dtype=torch.bool)
    real = mask.to(torch.float64)
    torch.testing.assert_close(out.sum(-1), real[:, None, :].expand(B, L, T))
    for b in range(B):
        for layer in range(L):
            chain = np.linalg.multi_dot([np.eye(T), *adj[b, layer::-1]])
            np.testing.assert_allclose(out[b, layer].numpy(), chain, atol=1e-12)
    assert (out >= 0).all()


def test_padding_equals_truncation() -> None:
    g = torch.Generator().manual_seed(3)
    atts = tuple(torch.rand(1, 2, 5, 5, generator=g, dtype=torch.float64).softmax(-1) for _ in range(4))
    mask = torch.tensor([[True, True, True, False, False]])
    short = tuple(a[..., :3, :3] for a in atts)
    for fn in (F.rollout, F.flow):
        padded = fn(atts, mask=mask)
        torch.testing.assert_close(padded[..., :3, :3], fn(short))
        assert (padded[..., 3:, :] == 0).all() and (padded[..., :, 3:] == 0).all()


def test_residual_one_is_identity_and_rollout_is_differentiable() -> None:
    att = torch.rand(2, 3, 4, 4, dtype=torch.float64).softmax(-1).requires_grad_()
    eye = torch.eye(4, dtype=torch.float64).expand(2, 2, 4, 4)
    torch.testing.assert_close(F.rollout((att, att), residual=1.0), eye)
    F.rollout((att, att), residual=0.5)[:, -1, 0, 0].sum().backward()
    assert att.grad is not None and torch.isfinite(att.grad).all() and att.grad.abs().sum() > 0


# ---------------------------------------------------------------- flow


@settings(max_examples=20, deadline=None)
@given(attention(max_t=5, max_layers=3))
def test_flow_matches_networkx(case: dict) -> None:
    ours = F.flow(**case)
    ref = F.flow_networkx(**case)
    assert ours.shape == ref.shape
    np.testing.assert_allclose(ours.numpy(), ref.numpy(), atol=1e-4)
    assert (ours >= 0).all() and (ours <= 1 + 1e-9).all()


def test_flow_deep_network_and_many_solver_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(7)
    atts = tuple(
        sparsemax(2 * torch.randn(2, 3, 6, 6, generator=g, dtype=torch.float64), dim=-1)
        for _ in range(5)
    )
    mask = torch.tensor([[True] * 6, [False, True, True, True, True, False]])
    ref = F.flow_networkx(atts, mask=mask).numpy()
    np.testing.assert_allclose(F.flow(atts, mask=mask).numpy(), ref, atol=1e-6)
    # a tiny edge budget splits the problems into one scipy call per copy
    monkeypatch.setattr(F, "_EDGE_BUDGET", 1)
    np.testing.assert_allclose(F.flow(atts, mask=mask).numpy(), ref, atol=1e-6)


def test_flow_first_layers_closed_form() -> None:
    a1 = _layer([[0.2, 0.8], [0.6, 0.4]])
    a2 = _layer([[0.9, 0.1], [0.3, 0.7]])
    out = F.flow((a1, a2), residual=0.0)
    torch.testing.assert_close(out[0, 0], a1[0, 0])
    # flow (0, j) → (2, i) = Σ_k min(Â1[k, j], Â2[i, k])
    expected = torch.tensor(
        [[min(0.2, 0.9) + min(0.6, 0.1), min(0.8, 0.9) + min(0.4, 0.1)],
         [min(0.2, 0.3) + min(0.6, 0.7), min(0.8, 0.3) + min(0.4, 0.7)]],
        dtype=torch.float64,
    )
    torch.testing.assert_close(out[0, 1], expected)


def test_bad_arguments_raise_one_line_errors() -> None:
    att = torch.rand(1, 2, 3, 3).softmax(-1)
    with pytest.raises(AttnAuditError, match="no attention layers"):
        F.rollout(())
    with pytest.raises(AttnAuditError, match="layer 1 has shape"):
        F.flow((att, att[:, :1]))
    with pytest.raises(AttnAuditError, match="expected \\(batch, heads, T, T\\)"):
        F.rollout((att[0],))
    with pytest.raises(AttnAuditError, match="unknown head fusion"):
        F.rollout((att,), head_fusion="median")  # type: ignore[arg-type]
    with pytest.raises(AttnAuditError, match="residual weight"):
        F.rollout((att,), residual=1.5)
    with pytest.raises(AttnAuditError, match="mask shape"):
        F.rollout((att,), mask=torch.ones(2, 3, dtype=torch.bool))


@pytest.mark.parametrize("layers", [1, 2, 3, 5])
def test_flow_to_chosen_sinks_equals_those_entries_of_the_full_flow(layers: int) -> None:
    """``sinks`` solves only the last layer's marked rows: they equal the full flow's, the rest is 0."""
    torch.manual_seed(layers)
    weights = [torch.softmax(torch.randn(3, 2, 6, 6), -1) for _ in range(layers)]
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 5 + [0]], dtype=torch.bool)
    sinks = torch.zeros(3, 6, dtype=torch.bool)
    sinks[0, 0] = sinks[1, [1, 3]] = sinks[2] = True
    sinks[2, 5] = False
    full = F.flow(weights, mask=mask)
    part = F.flow(weights, mask=mask, sinks=sinks)
    torch.testing.assert_close(part[:, -1], full[:, -1] * sinks[:, :, None])
    assert (part[:, :-1] == 0).all() and (part[:, -1][~sinks] == 0).all()
