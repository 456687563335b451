"""Diagnostic guided models: four settings end to end, imposed attention, adversary reuse, applicability."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from attnaudit.data.synthetic import synthetic_task
from attnaudit.experiments.diagnostic import GUIDED_ENCODER
from attnaudit.experiments.experiment import get_experiment
from attnaudit.experiments.runner import run_test
from attnaudit.models import ModelConfig, build_model
from attnaudit.models.rnn import AverageEncoder
from attnaudit.progress import set_quiet
from attnaudit.run import Run
from attnaudit.training.adversary import Variant, attention_of, train_variant
from attnaudit.training.trainer import train

set_quiet(True)


@pytest.fixture(scope="module")
def clf(tmp_path_factory: pytest.TempPathFactory) -> Run:
    data = synthetic_task("classification", seed=0, n_train=160, n_dev=30, n_test=30)
    return train(
        data, "bilstm", tmp_path_factory.mktemp("diagnostic") / "run", epochs=2, lr=1e-2, batch_size=16,
        embed_dim=16, hidden_dim=8, quiet_eval=True,
    )


def test_diagnostic_end_to_end_reuses_the_adversary_and_resumes(clf: Run, tmp_path: Path) -> None:
    run_test("global-adversary", clf, lambdas=[1.0], epochs=1, out=tmp_path, plot=False)
    adversary_metrics = tmp_path / "subruns" / "global-adversary" / "lambda-1-seed-0" / "metrics.json"
    stamp = adversary_metrics.stat().st_mtime_ns

    result = run_test("diagnostic", clf, epochs=1, adversary_lambda=1.0, out=tmp_path)
    assert adversary_metrics.stat().st_mtime_ns == stamp  # the global-adversary sub-run was loaded, not retrained
    settings = [row["setting"] for row in result.tables["scores"]]
    assert settings[:2] == ["base model (bilstm)", "adversary λ=1 (bilstm)"]
    assert settings[2:] == [f"{GUIDED_ENCODER} + {s} attention" for s in ("learned", "uniform", "base", "adversary")]
    for setting in ("learned", "uniform", "base", "adversary"):
        assert 0.0 <= result.summary[f"{setting}_guided_test_accuracy"] <= 1.0
    assert (tmp_path / "diagnostic_scores.png").exists()

    again = run_test("diagnostic", clf, epochs=1, adversary_lambda=1.0, out=tmp_path, plot=False)
    assert not any(row.get("trained_now") for row in again.tables["scores"])
    assert again.summary == result.summary


def test_guided_model_runs_on_the_base_attention(clf: Run, tmp_path: Path) -> None:
    variant = Variant(key={"kind": "test-guided"}, interventions=attention_of(clf.model, [0]), model={"model": GUIDED_ENCODER})
    sub = train_variant(clf, tmp_path / "guided", variant, epochs=1, seed=0)
    assert isinstance(sub.model.encoder, AverageEncoder)
    batch = next(clf.batches(clf.examples("test"), 8))
    with torch.no_grad():
        imposed = sub.model(batch, sub.interventions(batch)).trace[0].weights
        original = clf.model(batch).trace[0].weights
    torch.testing.assert_close(imposed, original)


def test_diagnostic_needs_single_attention_classifier(clf: Run) -> None:
    experiment = get_experiment("diagnostic")
    assert experiment.applies(clf) is None
    tagging = dataclasses.replace(clf, task=dataclasses.replace(clf.task, task_type="tagging"))
    assert "average encoder" in experiment.applies(tagging)
    config = ModelConfig(model="transformer", task_type="classification", vocab_size=8, num_labels=2, embed_dim=8, d_model=8, heads=2)
    transformer = dataclasses.replace(clf, model=build_model(config))
    assert "bilstm, cnn or average" in experiment.applies(transformer)
