"""Key tests: plumbing (identity keys reproduce the model), bounded loss, seeding, freezing, targets."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnaudit.errors import AttnAuditError
from attnaudit.experiments.common.seeding import seeded_generator
from attnaudit.experiments.experiment import get_experiment
from attnaudit.experiments.keys import (
    KeyAdversary,
    OppositeKeys,
    RandomKeys,
    bounded_distance,
    key_interventions,
    relative_distance,
    stacked_keys,
)
from attnaudit.experiments.runner import make_options, run_test
from attnaudit.models import ModelConfig, build_model
from attnaudit.run import Run, TaskSpec

TINY = {"epochs": 1, "train_limit": 64, "batch_size": 16, "show": 1}


def test_adversary_maps_all_layers_per_token() -> None:
    torch.manual_seed(0)
    adversary = KeyAdversary(layers=2, d_model=4, hidden=8)
    keys = torch.randn(3, 2, 5, 4)
    out = adversary(keys)
    assert out.shape == keys.shape
    # Token 1's output depends on token 1's keys of every layer, and on nothing else.
    changed = keys.clone()
    changed[:, 1, 0] += 1.0
    diff = (adversary(changed) - out).abs().sum(-1)  # (B, L, T)
    assert torch.all(diff[:, :, 0] > 0) and torch.all(diff[:, :, 1:] == 0)


def test_original_keys_as_interventions_reproduce_the_model(tiny_transformer_run: Run) -> None:
    model = tiny_transformer_run.model
    batch = next(tiny_transformer_run.batches(tiny_transformer_run.examples("test", 8), 8))
    with torch.no_grad():
        clean = model(batch)
        keys = stacked_keys(clean.trace)
        assert keys.shape == (8, 2, batch.tokens.shape[1], 16)
        replayed = model(batch, key_interventions(keys, heads=2))
    torch.testing.assert_close(replayed.logits, clean.logits)
    for a, b in zip(clean.trace.layers, replayed.trace.layers):
        torch.testing.assert_close(a.weights, b.weights)


def test_distances_by_hand_and_bounded() -> None:
    keys = torch.tensor([[[[3.0, 4.0], [1.0, 0.0], [9.0, 9.0]]]])  # (1,1,3,2), norms 5, 1, pad
    new = torch.tensor([[[[3.0, 4.0], [1.0, 2.0], [0.0, 0.0]]]])
    mask = torch.tensor([[True, True, False]])
    assert float(relative_distance(keys, new, mask)) == pytest.approx((0.0 + 2.0) / 2)
    assert float(bounded_distance(keys, new, mask)) == pytest.approx((0.0 + float(torch.tanh(torch.tensor(2.0)))) / 2)
    huge = bounded_distance(keys, new * 1e6, mask)
    assert 0.0 <= float(huge) <= 1.0  # saturates: inflating keys gains nothing more


@given(labels=st.lists(st.integers(0, 4), min_size=1, max_size=20), classes=st.integers(2, 5))
def test_opposite_targets_are_a_derangement(labels: list[int], classes: int) -> None:
    gold = torch.tensor([y % classes for y in labels])
    target = OppositeKeys()._targets(gold, classes)
    assert torch.all(target != gold) and torch.all((target >= 0) & (target < classes))
    assert torch.equal(OppositeKeys()._targets(torch.tensor([0, 1]), 2), torch.tensor([1, 0]))


def test_random_keys_input_ignores_the_keys() -> None:
    keys_a, keys_b = torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4)
    a = RandomKeys()._inputs(keys_a, seeded_generator(0, 1))
    b = RandomKeys()._inputs(keys_b, seeded_generator(0, 1))
    assert torch.equal(a, b) and a.min() >= -1.0 and a.max() <= 1.0


def test_key_adversary_is_seeded_and_leaves_the_model_untouched(tiny_transformer_run: Run, tmp_path: Path) -> None:
    model = tiny_transformer_run.model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = [p.requires_grad for p in model.parameters()]
    first = run_test("key-adversary", tiny_transformer_run, out=tmp_path / "a", seed=2, **TINY)
    again = run_test("key-adversary", tiny_transformer_run, out=tmp_path / "b", seed=2, plot=False, **TINY)
    assert first.summary == again.summary
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert [p.requires_grad for p in model.parameters()] == flags
    assert not model.training
    summary = first.summary
    assert set(summary) >= {"accuracy_original", "accuracy_attacked", "jsd_layer0_mean", "jsd_layer1_mean", "key_distance_mean"}
    assert 0.0 <= summary["jsd_mean"] <= 0.6932
    assert summary["key_distance_mean"] > 0
    assert first.tables["training"][0]["epoch"] == 1
    assert len(first.instances) == len(tiny_transformer_run.examples("test"))
    assert {Path(p).name for p in first.figures} >= {"key-adversary.png", "key-adversary-attention.png"}
    assert any("bounded" in note for note in first.meta["notes"])


def test_opposite_keys_learn_to_flip_predictions(tiny_transformer_run: Run) -> None:
    experiment = get_experiment("opposite-keys")
    options = make_options(experiment, {"epochs": 3, "train_limit": 200, "batch_size": 16})
    result = experiment.run(tiny_transformer_run, tiny_transformer_run.examples("test"), options, seed=0)
    history = result.tables["training"]
    assert history[-1]["ce"] < history[0]["ce"]
    # Against the swapped labels the trained model starts near 1 - accuracy; the keys alone raise it.
    assert result.summary["accuracy_attacked"] > result.summary["accuracy_original"]
    assert all(row["target"] != row["label"] for row in result.instances)


def test_random_keys_run_and_option_errors(tiny_transformer_run: Run) -> None:
    experiment = get_experiment("random-keys")
    result = experiment.run(tiny_transformer_run, tiny_transformer_run.examples("test", 16), make_options(experiment, TINY))
    assert 0.0 <= result.summary["accuracy_attacked"] <= 1.0
    assert not hasattr(experiment.Options(), "alpha")  # CE alone: no trade-off option
    adversary = get_experiment("key-adversary")
    with pytest.raises(AttnAuditError, match="--alpha must lie in"):
        adversary.run(tiny_transformer_run, tiny_transformer_run.examples("test", 2), make_options(adversary, {"alpha": 1.5}))
    with pytest.raises(AttnAuditError, match="--train-limit"):
        adversary.run(tiny_transformer_run, tiny_transformer_run.examples("test", 2), make_options(adversary, {"train_limit": 0}))


def test_not_applicable_to_other_families() -> None:
    config = ModelConfig(model="bilstm", task_type="classification", vocab_size=10, num_labels=2, embed_dim=4, hidden_dim=4)
    task = TaskSpec("toy", "classification", ["a", "b"])
    run = Run(model=build_model(config), collate=lambda xs: None, task=task)  # type: ignore[arg-type,return-value]
    for name in ("key-adversary", "random-keys", "opposite-keys"):
        assert "bilstm" in get_experiment(name).applies(run)
