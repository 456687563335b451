"""Activation swap: accuracy with another normaliser, applicability, shared helpers, figures."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnaudit.algorithms.metrics import row_mean
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.activation_swap import ActivationSwap, zero_fraction
from attnaudit.experiments.common.applies import self_attention_classifier_reason, transformer_classifier_reason
from attnaudit.experiments.common.rows import ATTENTION_TABLE
from attnaudit.experiments.runner import make_options, run_test
from attnaudit.models import ModelConfig, build_model
from attnaudit.models.interface import AttentionLayer, AttentionTrace
from attnaudit.run import Run, TaskSpec
from attnaudit.training.trainer import evaluate_examples


def untrained_run(model: str, task_type: str) -> Run:
    config = ModelConfig(model=model, task_type=task_type, vocab_size=20, num_labels=2, embed_dim=8,
                         hidden_dim=8, d_model=8, heads=2, d_ff=16)
    task = TaskSpec("toy", task_type, ["a", "b"])
    return Run(model=build_model(config), collate=lambda xs: None, task=task)  # type: ignore[arg-type,return-value]


def test_applies_to_self_attention_classifiers_and_keys_to_transformers_only() -> None:
    assert "bilstm" in transformer_classifier_reason(untrained_run("bilstm", "classification"))
    assert "tagging" in transformer_classifier_reason(untrained_run("transformer", "tagging"))
    assert transformer_classifier_reason(untrained_run("transformer", "classification")) is None
    assert "bilstm" in self_attention_classifier_reason(untrained_run("bilstm", "classification"))
    assert self_attention_classifier_reason(untrained_run("transformer", "classification")) is None


def test_zero_fraction_and_row_mean_by_hand() -> None:
    weights = torch.tensor([[[[0.5, 0.5, 0.0], [1.0, 0.0, 0.0], [0.2, 0.3, 0.5]]]])  # (1,1,3,3)
    mask = torch.tensor([[True, True, False]])
    trace = AttentionTrace([AttentionLayer(weights=weights, mask=mask, inputs=torch.zeros(1, 3, 2), query_mask=mask)])
    # Real pairs: queries 0,1 x keys 0,1 -> weights 0.5, 0.5, 1.0, 0.0 -> one zero of four.
    assert float(zero_fraction(trace)[0]) == pytest.approx(0.25)
    # Causal: query 0 may read key 0 only, query 1 keys 0 and 1 -> weights 0.5, 1.0, 0.0 -> one zero of three.
    assert float(zero_fraction(trace, causal=True)[0]) == pytest.approx(1 / 3)
    values = torch.tensor([[[1.0, 3.0, 100.0]]])
    assert float(row_mean(values, mask)[0]) == pytest.approx(2.0)


def test_swap_accuracies_match_the_trainer_and_the_identity_swap(tiny_transformer_run: Run, tmp_path: Path) -> None:
    run = tiny_transformer_run
    examples = run.examples("test")
    result = run_test("activation-swap", run, split="test", out=tmp_path, batch_size=16, show=2)
    reference = evaluate_examples(run, examples)["accuracy"]
    assert result.summary["accuracy_original"] == pytest.approx(reference)
    rows = {r["normaliser"]: r for r in result.tables["normalisers"]}
    assert set(rows) == {"softmax", "entmax15", "sparsemax"}
    trained = rows["entmax15"]
    assert trained["trained"] and trained["accuracy"] == pytest.approx(reference)
    assert trained["jsd_layer0"] == pytest.approx(0.0, abs=1e-7) and trained["jsd_layer1"] == pytest.approx(0.0, abs=1e-7)
    assert rows["softmax"]["zero_fraction"] == 0.0  # softmax is never exactly zero
    assert rows["sparsemax"]["zero_fraction"] >= rows["entmax15"]["zero_fraction"] > 0.0
    assert rows["softmax"]["jsd_layer0"] > 1e-4
    assert len(result.instances) == len(examples)
    heat = result.tables[ATTENTION_TABLE]
    assert len(heat) == 2 * 4  # two sentences x (trained + three swaps)
    first = heat[0]
    assert len(first["weights"]) == len(first["tokens"]) == len(examples[0].tokens)
    assert all(abs(sum(row) - 1.0) < 1e-5 for row in first["weights"])
    assert (tmp_path / "activation-swap.json").exists()
    assert {Path(p).name for p in result.figures} >= {"activation-swap.png", "activation-swap-attention.svg"}


def test_unknown_normaliser_is_a_one_line_error(tiny_transformer_run: Run) -> None:
    experiment = ActivationSwap()
    options = make_options(experiment, {"normalisers": ["softmax", "relu"]})
    with pytest.raises(AttnAuditError, match="unknown attention normaliser 'relu'"):
        experiment.run(tiny_transformer_run, tiny_transformer_run.examples("test", 4), options)
