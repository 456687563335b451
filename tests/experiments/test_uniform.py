"""Uniform-attention baseline: the frozen intervention, the trainer hook, resume, determinism, end to end."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from attnaudit.algorithms.metrics import jsd, output_change
from attnaudit.data.synthetic import synthetic_task
from attnaudit.experiments.common.published import compare
from attnaudit.experiments.experiment import get_experiment
from attnaudit.experiments.runner import run_test
from attnaudit.experiments.uniform import UNIFORM
from attnaudit.models.interface import freeze_uniform, uniform_weights
from attnaudit.progress import set_quiet
from attnaudit.run import Run, load_run
from attnaudit.training.adversary import Variant, frozen_uniform, train_variant
from attnaudit.training.trainer import predict, train

set_quiet(True)


@pytest.fixture(scope="module")
def clf(tmp_path_factory: pytest.TempPathFactory) -> Run:
    data = synthetic_task("classification", seed=0, n_train=200, n_dev=30, n_test=30)
    return train(
        data, "bilstm", tmp_path_factory.mktemp("uniform") / "run", epochs=3, lr=1e-2, batch_size=16,
        embed_dim=16, hidden_dim=8, quiet_eval=True,
    )


def _batch(run: Run):
    return next(run.batches(run.examples("test"), 8))


def test_frozen_uniform_spreads_attention_over_real_tokens_only(clf: Run) -> None:
    batch = _batch(clf)
    weights = clf.model(batch, frozen_uniform(batch)).trace[0].weights
    lengths = batch.mask.sum(-1, keepdim=True).float()
    expected = batch.mask.float() / lengths
    torch.testing.assert_close(weights[:, 0, 0], expected)


def test_predict_applies_interventions_in_every_forward(clf: Run) -> None:
    examples = clf.examples("test")[:8]
    frozen = predict(clf, examples, interventions=frozen_uniform)["probs"]
    plain = predict(clf, examples)["probs"]
    with torch.no_grad():
        batch = clf.collate(examples)
        manual = clf.model(batch, frozen_uniform(batch)).probs
    torch.testing.assert_close(torch.tensor(frozen), manual, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(torch.tensor(frozen), torch.tensor(plain))


def test_compare_against_uniform_attention_matches_hand_computation(clf: Run) -> None:
    examples = clf.examples("test")[:10]
    result = compare(clf, clf.model, examples, frozen_uniform)
    with torch.no_grad():
        batch = clf.collate(examples)
        base = clf.model(batch)
        frozen = clf.model(batch, frozen_uniform(batch))
    w = base.trace[0].weights
    expected_jsd = jsd(uniform_weights(w, batch.mask), w)[:, 0, 0]
    expected_tvd = output_change(frozen.probs, base.probs)
    assert result["jsd"] == pytest.approx(expected_jsd.double().numpy(), abs=1e-6)
    assert result["tvd"] == pytest.approx(expected_tvd.double().numpy(), abs=1e-6)


def test_uniform_end_to_end_and_resume(clf: Run, tmp_path: Path) -> None:
    result = run_test("uniform", clf, epochs=1, out=tmp_path)
    table = result.tables["scores"]
    assert [row["model"] for row in table] == ["base (learned attention)", "uniform attention"]
    s = result.summary
    assert s["difference"] == pytest.approx(s["base_test_accuracy"] - s["uniform_test_accuracy"])
    assert 0.0 <= s["mean_jsd"] <= 0.7 and 0.0 <= s["mean_tvd"] <= 1.0
    assert (tmp_path / "uniform.json").exists() and (tmp_path / "uniform_scores.png").exists()
    assert len(result.instances) == 30
    sub_run = load_run(tmp_path / "subruns" / "uniform" / "seed-0")  # agreement: the uniform model predicts the base's class
    for row, example in zip(result.instances, clf.examples("test", None)):
        batch = next(iter(clf.batches([example], 1)))
        with torch.no_grad():
            base = clf.model(batch).logits.argmax(-1)
            frozen = sub_run.model(batch, [freeze_uniform()]).logits.argmax(-1)
        assert row["agreement"] == float(base.item() == frozen.item())

    sub = tmp_path / "subruns" / "uniform" / "seed-0"  # --out holds the sub-runs too
    stamps = {name: (sub / name).stat().st_mtime_ns for name in ("metrics.json", "model.safetensors")}
    again = run_test("uniform", clf, epochs=1, out=tmp_path)
    assert again.tables["scores"][1]["trained_now"] is False
    assert {name: (sub / name).stat().st_mtime_ns for name in stamps} == stamps
    assert again.summary == result.summary

    changed = run_test("uniform", clf, epochs=2, out=tmp_path)  # another config: retrained, not reused
    assert changed.tables["scores"][1]["trained_now"] is True


def test_training_with_frozen_attention_is_deterministic(clf: Run, tmp_path: Path) -> None:
    a = train_variant(clf, tmp_path / "a", UNIFORM, epochs=1, seed=3)
    b = train_variant(clf, tmp_path / "b", UNIFORM, epochs=1, seed=3)
    c = train_variant(clf, tmp_path / "c", UNIFORM, epochs=1, seed=4)
    for name, value in a.model.state_dict().items():
        torch.testing.assert_close(value, b.model.state_dict()[name], rtol=0, atol=0)
    assert a.metrics["history"] == b.metrics["history"] and a.metrics["test"] == b.metrics["test"]
    assert not torch.equal(a.model.output.weight, c.model.output.weight)


def test_not_applicable_without_run_config_or_directory(clf: Run) -> None:
    experiment = get_experiment("uniform")
    assert experiment.applies(clf) is None
    assert "would mean retraining or fine-tuning it" in experiment.applies(dataclasses.replace(clf, info={"kind": "hf"}))
    assert "no directory" in experiment.applies(dataclasses.replace(clf, path=None))


def test_sub_runs_follow_the_base_learning_rate_schedule(clf: Run, tmp_path: Path) -> None:
    def moved(warmup: int) -> float:
        info = {**clf.info, "train": {**clf.info["train"], "warmup": warmup}}
        base = dataclasses.replace(clf, info=info)
        sub = train_variant(base, tmp_path / f"warmup-{warmup}", Variant(key={"kind": "t"}, start=clf.model), epochs=1)
        return max(float((sub.model.state_dict()[k] - v).abs().max()) for k, v in clf.model.state_dict().items())

    # a warmup far longer than the run keeps the learning rate near 0: the weights hardly leave the start
    assert moved(10**7) < 1e-4 < moved(0)
