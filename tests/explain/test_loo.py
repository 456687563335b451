"""Leave-one-out: the family shortcuts against Captum's FeatureAblation, exact removal, batch independence."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnaudit.data.types import Batch
from attnaudit.explain import item_mask
from attnaudit.explain.helpers.items import compact_items
from attnaudit.explain.methods.loo import loo_importance, loo_importance_reference
from attnaudit.models import ModelConfig, build_model
from attnaudit.run import Run, TaskSpec

from .conftest import FAMILIES


@pytest.mark.parametrize("family", list(FAMILIES))
def test_fast_loo_equals_captum_feature_ablation(runs: dict, family: str) -> None:
    run, batch = runs[family]
    fast, reference = loo_importance(run, batch), loo_importance_reference(run, batch)
    torch.testing.assert_close(fast, reference, atol=1e-5, rtol=0, equal_nan=True)
    assert fast.nan_to_num(0).abs().max() > 0  # not vacuously equal
    mask = item_mask(run, batch)
    assert fast[-1][mask[-1]].isnan().all() and (fast[:-1][mask[:-1]] >= 0).all()  # one item: NaN


@settings(max_examples=12, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=5),
    encoder=st.sampled_from(["bilstm", "average", "cnn"]),
    seed=st.integers(0, 1000),
)
def test_fast_loo_equals_reference_on_random_models(lengths: list[int], encoder: str, seed: int) -> None:
    """Untrained models, arbitrary length mixes: the shortcuts must still be exact removals."""
    torch.manual_seed(seed)
    config = ModelConfig(
        model=encoder, task_type="classification", vocab_size=30, num_labels=3, embed_dim=6, hidden_dim=5,
        cnn_kernels=(1, 3, 4), cnn_filters=3, attention="sparsemax" if seed % 2 else "softmax",
    )
    model = build_model(config).eval()
    # Large random weights make the outputs move visibly when a token goes.
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    run = Run(model=model, collate=None, task=TaskSpec(spec="x", task_type="classification", labels=["a", "b", "c"]))  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    tokens = torch.randint(2, 30, (len(lengths), width), generator=g) * mask
    batch = Batch(tokens=tokens, mask=mask)
    torch.testing.assert_close(
        loo_importance(model, batch), loo_importance_reference(run, batch), atol=1e-5, rtol=0, equal_nan=True
    )


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.lists(st.booleans(), min_size=1, max_size=7), min_size=1, max_size=4))
def test_compact_removes_exactly_the_dropped_items(rows: list[list[bool]]) -> None:
    width = max(len(r) for r in rows)
    mask = torch.tensor([[i < len(r) for i in range(width)] for r in rows])
    tokens = (torch.arange(width)[None, :] + 10 * torch.arange(len(rows))[:, None] + 1) * mask
    keep = torch.tensor([r + [False] * (width - len(r)) for r in rows]) & mask
    out = compact_items(Batch(tokens=tokens, mask=mask), torch.arange(len(rows)), keep, pad_id=0)
    for b in range(len(rows)):
        expected = tokens[b][keep[b]].tolist()
        assert out.tokens[b][out.mask[b]].tolist() == expected
        assert out.mask[b].tolist()[: len(expected)] == [True] * len(expected)
        assert not out.mask[b, len(expected) :].any()


@pytest.mark.parametrize("family", ["bilstm", "cnn", "transformer", "han", "pair-average"])
def test_loo_does_not_depend_on_the_batch(runs: dict, family: str) -> None:
    """An instance's leave-one-out is the same alone as padded inside a batch."""
    run, batch = runs[family]
    together = loo_importance(run, batch)
    for b in (0, 2):
        alone = loo_importance(run, run.collate([batch.examples[b]]))
        k = alone.shape[1]
        torch.testing.assert_close(together[b, :k], alone[0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", ["bilstm", "transformer"])
def test_loo_tokens_removes_only_the_highest_gradient_items(runs: dict, family: str) -> None:
    """``loo_tokens=K``: each instance's K items of highest gradient importance get their exact LOO value,
    every other item 0; K of at least the longest instance is the exact mode."""
    from attnaudit.explain.methods.gradient import gradient_importance

    run, batch = runs[family]
    exact = loo_importance(run, batch)
    approx = loo_importance(run, batch, loo_tokens=2)
    mask = item_mask(run, batch)
    grads = gradient_importance(run, batch)
    for b in range(len(batch)):
        real = mask[b].nonzero().flatten()
        if len(real) < 2:
            continue
        top = real[torch.sort(grads[b, real], descending=True, stable=True).indices[:2]]
        torch.testing.assert_close(approx[b, top], exact[b, top])
        others = real[~torch.isin(real, top)]
        assert (approx[b, others] == 0).all()
    torch.testing.assert_close(loo_importance(run, batch, loo_tokens=int(mask.sum(1).max())), exact, equal_nan=True)


def test_loo_tokens_must_be_positive(runs: dict) -> None:
    from attnaudit.errors import AttnAuditError

    run, batch = runs["bilstm"]
    with pytest.raises(AttnAuditError, match=r"^--loo-tokens must be at least 1, got 0$"):
        loo_importance(run, batch, loo_tokens=0)
