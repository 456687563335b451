"""Shared helpers: per-instance seeding, row means, statistics, applicability, instance rows, plots."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from attnaudit.algorithms.metrics import row_mean
from attnaudit.data.types import Example
from attnaudit.errors import AttnAuditError
from attnaudit.experiments import common
from attnaudit.experiments.common import passes
from attnaudit.experiments.common.applies import (
    resolve_layers,
    self_attention_classifier_reason,
    single_attention_reason,
    transformer_classifier_reason,
)
from attnaudit.experiments.common.measures import max_attention, spearman_rho, weighted_mean
from attnaudit.experiments.common.passes import Explained, base_pass, prepare, take_rows
from attnaudit.experiments.common.plots import plot_histogram
from attnaudit.experiments.common.rows import instance_rows
from attnaudit.experiments.common.seeding import seeded_generator
from attnaudit.experiments.experiment import discover
from attnaudit.models.interface import Cache


def _draws(*keys: int) -> torch.Tensor:
    return torch.rand(8, generator=seeded_generator(*keys))


def test_seeded_generator_is_deterministic_per_seed_and_instance() -> None:
    assert torch.equal(_draws(3, 7), _draws(3, 7))
    _draws(3, 8)  # another instance's generator does not disturb this one's stream
    assert torch.equal(_draws(3, 7), _draws(3, 7))
    assert not torch.equal(_draws(3, 7), _draws(3, 8))  # another instance
    assert not torch.equal(_draws(3, 7), _draws(4, 7))  # another seed
    assert not torch.equal(_draws(3, 7), _draws(7, 3))  # the order of the keys matters
    assert torch.equal(_draws(np.int64(3), 7), _draws(3, 7))  # numpy integers seed alike


def test_seeded_generator_matches_its_seed_sequence() -> None:
    state = int(np.random.SeedSequence([5, 2, 1]).generate_state(1, dtype=np.uint64)[0])
    assert seeded_generator(5, 2, 1).initial_seed() == state


def test_row_mean_over_a_masked_toy_tensor_by_hand() -> None:
    values = torch.tensor(
        [
            [[1.0, 2.0, 100.0], [3.0, 6.0, 100.0]],  # instance 0: two heads, query 2 is padding
            [[4.0, -1.0, -1.0], [8.0, -1.0, -1.0]],  # instance 1: only query 0 is real
        ]
    )
    rows = torch.tensor([[True, True, False], [True, False, False]])
    assert row_mean(values, rows).tolist() == [(1 + 2 + 3 + 6) / 4, (4 + 8) / 2]
    # Extra dimensions between the instance and the heads (e.g. adversaries) keep their own means.
    stacked = torch.stack([values, 2 * values], dim=1)  # (B, 2, H, Q)
    assert row_mean(stacked, rows).tolist() == [[3.0, 6.0], [6.0, 12.0]]
    # An instance without a real row gives 0, not NaN.
    assert row_mean(values, torch.zeros(2, 3, dtype=torch.bool)).tolist() == [0.0, 0.0]


def test_max_attention_averages_row_peaks_over_heads_and_real_rows() -> None:
    weights = torch.tensor([[[[0.5, 0.5], [0.9, 0.1]], [[1.0, 0.0], [0.3, 0.7]]]])  # (1, H=2, Q=2, K=2)
    assert float(max_attention(weights, torch.tensor([[True, True]]))) == pytest.approx((0.5 + 0.9 + 1.0 + 0.7) / 4)
    assert float(max_attention(weights, torch.tensor([[True, False]]))) == pytest.approx((0.5 + 1.0) / 2)


def test_weighted_mean_skips_non_finite_values() -> None:
    assert weighted_mean(np.array([1.0, 3.0, np.nan]), np.array([1.0, 3.0, 5.0])) == pytest.approx(2.5)
    assert math.isnan(weighted_mean(np.array([1.0, np.inf]), np.array([0.0, 2.0])))


def test_spearman_rho_is_nan_for_short_or_constant_inputs() -> None:
    a = np.array([0.1, 0.4, 0.2, 0.9])
    assert spearman_rho(a, a * 3) == pytest.approx(1.0)
    assert spearman_rho(a, -a) == pytest.approx(-1.0)
    assert math.isnan(spearman_rho(a[:2], a[:2]))
    assert math.isnan(spearman_rho(np.full(4, 0.25), a))
    assert math.isnan(spearman_rho(a, np.ones(4)))


def _run(family: str, task_type: str, labels: list[str] | None = None, self_attention: bool = True) -> Any:
    return SimpleNamespace(family=family, task=SimpleNamespace(task_type=task_type), labels=labels or ["neg", "pos"],
                           model=SimpleNamespace(self_attention=self_attention))


def test_applicability_reasons() -> None:
    assert single_attention_reason(_run("bilstm", "classification")) is None
    assert "tagger" in single_attention_reason(_run("transformer", "tagging"))
    assert "translation" in single_attention_reason(_run("transformer", "seq2seq"))
    assert transformer_classifier_reason(_run("transformer", "classification")) is None
    assert "'han'" in transformer_classifier_reason(_run("han", "classification"))
    assert "'pair'" in transformer_classifier_reason(_run("transformer", "pair"))
    assert "'hf'" in transformer_classifier_reason(_run("hf", "classification"))  # the key tests: our Transformer only
    assert self_attention_classifier_reason(_run("hf", "classification")) is None  # swap and shuffle: HF too
    assert "'hf'" in self_attention_classifier_reason(_run("hf", "classification", self_attention=False))  # Marian, T5


def test_resolve_layers() -> None:
    model: Any = SimpleNamespace(num_attention_layers=3, explained_layer=-1)
    assert resolve_layers(model, "explained") == [2]
    assert resolve_layers(model, "all") == [0, 1, 2]
    assert resolve_layers(model, "-3") == [0]
    with pytest.raises(AttnAuditError, match="not supported"):
        resolve_layers(model, "all", allow_all=False)
    with pytest.raises(AttnAuditError, match="out of range"):
        resolve_layers(model, "3")


def test_take_rows_selects_states_mask_and_per_instance_extras() -> None:
    states = torch.arange(3 * 2 * 1.0).view(3, 2, 1)
    cache = Cache(states, torch.tensor([[1, 1], [1, 0], [0, 0]]), layer=1, extra={"query": torch.tensor([7, 8, 9]), "n": 5})
    picked = take_rows(cache, torch.tensor([2, 0, 0]), size=3)
    assert torch.equal(picked.states, states[[2, 0, 0]])
    assert picked.mask.tolist() == [[0, 0], [1, 1], [1, 1]]
    assert picked.extra["query"].tolist() == [9, 7, 7] and picked.extra["n"] == 5 and picked.layer == 1
    with pytest.raises(AttnAuditError, match="one per instance"):
        take_rows(cache, torch.tensor([0]), size=4)


def test_instance_rows_identify_each_instance() -> None:
    weights = torch.tensor([[[[0.8, 0.2, 0.0]]], [[[0.5, 0.5, 0.0]]]])  # (B=2, H=1, Q=1, K=3)
    key_mask = torch.tensor([[True, True, False], [True, True, True]])
    explained = Explained(
        cache=Cache(torch.zeros(2, 3, 1), key_mask),
        layers=[0],
        weights=[weights],
        key_mask=key_mask,
        query_rows=torch.ones(2, 1, dtype=torch.bool),
        probs=torch.tensor([[0.9, 0.1], [0.2, 0.8]]),
    )
    examples = [Example(tokens=["a", "b"], label="neg", meta={"source": "s:1"}), Example(tokens=["c", "d", "e"], label="neg")]
    rows = instance_rows(_run("bilstm", "classification"), examples, explained, indices=[10, 11])
    assert rows == [
        {"index": 10, "source": "s:1", "label": "neg", "predicted": "neg", "items": 2, "max_attention": pytest.approx(0.8)},
        {"index": 11, "source": "", "label": "neg", "predicted": "pos", "items": 3, "max_attention": pytest.approx(0.5)},
    ]


def test_plot_histogram_writes_png_and_svg(tmp_path: Path) -> None:
    paths = plot_histogram([0.1, 0.2, float("nan"), 0.4], "change", "toy", tmp_path, "toy_histogram", 0.05)
    assert [p.name for p in paths] == ["toy_histogram.png", "toy_histogram.svg"]
    assert all(p.stat().st_size > 0 for p in paths)


def test_discovery_imports_common_without_registering_a_test() -> None:
    registry = discover()
    assert registry and all(not cls.__module__.startswith(common.__name__) for cls in registry.values())
    assert {"permutation", "adversarial", "shuffle", "seeds"} <= set(registry)


def test_encoder_last_layer_interventions_change_the_cls_row_only(tiny_hf: SimpleNamespace) -> None:
    """A BERT classifier reads [CLS] of the last layer: the single-attention tests change that row
    there (every real row at an earlier layer), and a permutation of it equals the full-model loop."""
    from attnaudit.experiments.permutation import permutation_loop, permute_batch
    from attnaudit.hf import load_hf

    run = load_hf(tiny_hf.dir, task=tiny_hf.task(), device="cpu")
    examples = run.data().test[:4]
    batch = run.collate(examples)
    last = run.model.num_attention_layers - 1
    explained = prepare(run.model, batch, [last])
    assert explained.query_rows.tolist() == [[j == 0 for j in range(batch.mask.shape[1])]] * 4
    earlier = prepare(run.model, batch, [0])
    assert torch.equal(earlier.query_rows, batch.mask.bool())
    ours = permute_batch(run.model, batch, [last], 5, seed=0, indices=range(4))
    np.testing.assert_allclose(ours.changes.numpy(), permutation_loop(run, examples, [last], 5, seed=0), atol=1e-5)


def test_the_prepared_pass_is_shared_within_an_audit_only(tiny_attention_run: Any) -> None:
    """Within :func:`memoised` a batch's prepared pass is computed once (permutation, faithfulness, erasure
    and adversarial share it); outside, every call makes its own."""
    from attnaudit.explain.registry import memoised

    run = tiny_attention_run("transformer")
    batch = run.collate(run.examples("test", 4))
    layers = resolve_layers(run.model, "explained")
    assert prepare(run.model, batch, layers) is not prepare(run.model, batch, layers)
    with memoised(run.model):
        first = prepare(run.model, batch, layers)
        assert prepare(run.model, batch, layers) is first
        assert prepare(run.model, batch, [0]) is not first
        other = run.collate([copy.copy(e) for e in run.examples("test", 4)])  # new example objects: another batch
        assert prepare(run.model, other, layers) is not first
    fresh = prepare(run.model, batch, layers)
    torch.testing.assert_close(fresh.probs, first.probs, rtol=0, atol=0)


def test_the_base_pass_keeps_weights_and_the_explained_record_within_a_budget(
    tiny_attention_run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shared plain pass equals ``model(batch)``: every layer's weights and masks, the explained layer's
    whole record, the other layers' states dropped; past the byte budget nothing more is kept."""
    from attnaudit.explain.registry import memoised

    run = tiny_attention_run("transformer")
    model = run.model
    batch = run.collate(run.examples("test", 4))
    with torch.no_grad():
        full = model(batch)
    with memoised(model) as memo:
        shared = base_pass(model, batch)
        assert base_pass(model, batch) is shared and memo.held == shared.trace.nbytes + shared.logits.numel() * 4
        assert torch.equal(shared.logits, full.logits)
        explained = model.explained_layer % len(full.trace)
        for index, (mine, whole) in enumerate(zip(shared.trace, full.trace)):
            assert torch.equal(mine.weights, whole.weights) and torch.equal(mine.mask, whole.mask)
            if index == explained:
                assert torch.equal(mine.inputs, whole.inputs) and torch.equal(mine.keys, whole.keys)
            else:
                assert mine.keys is None and mine.values is None and mine.inputs.numel() == 0
        assert shared.trace.nbytes < full.trace.nbytes
    monkeypatch.setattr(passes, "BASE_PASS_BUDGET", 0)
    with memoised(model) as memo:
        first = base_pass(model, batch)
        assert base_pass(model, batch) is not first and len(memo) == 0 and memo.held == 0
