"""The importance experiment end to end on tiny runs, and its τ against scipy."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from attnaudit.data.synthetic import synthetic_task
from attnaudit.data.types import Example
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.experiment import Result
from attnaudit.experiments.importance import PUBLISHED, ImportanceCorrelation
from attnaudit.experiments.runner import make_options, run_test
from attnaudit.explain import item_mask
from attnaudit.explain.methods.attention import attention_importance
from attnaudit.explain.methods.gradient import gradient_importance
from attnaudit.explain.methods.loo import loo_importance
from attnaudit.models import ModelConfig, build_model
from attnaudit.progress import set_quiet
from attnaudit.run import Run, TaskSpec
from attnaudit.training.trainer import train

TASK = synthetic_task("classification", seed=0, n_train=150, n_dev=30, n_test=30)
TINY = {"epochs": 1, "embed_dim": 16, "hidden_dim": 8, "quiet_eval": True}


@pytest.fixture(scope="module")
def bilstm(tmp_path_factory: pytest.TempPathFactory) -> Run:
    set_quiet(True)
    return train(TASK, "bilstm", tmp_path_factory.mktemp("runs") / "bilstm", **TINY)


@pytest.fixture(scope="module")
def transformer(tmp_path_factory: pytest.TempPathFactory) -> Run:
    set_quiet(True)
    return train(
        TASK, "transformer", tmp_path_factory.mktemp("runs") / "transformer", d_model=16, heads=2, layers=2, **TINY
    )


def test_end_to_end_writes_results_and_figures(bilstm: Run, tmp_path: Path) -> None:
    result = run_test("importance", bilstm, limit=12, out=tmp_path, methods=["gradient", "loo", "ig"], ig_steps=8)
    saved = Result.load(tmp_path / "importance.json")
    assert saved.summary == json.loads(json.dumps(result.summary))
    assert (tmp_path / "importance.csv").exists()
    for stem in ("importance_tau_hist",):
        assert (tmp_path / f"{stem}.png").stat().st_size > 0 and (tmp_path / f"{stem}.svg").exists()
    assert sorted(Path(f).name for f in result.figures) == ["importance_tau_hist.png", "importance_tau_hist.svg"]
    pairs = [row["pair"] for row in result.tables["pairs"]]
    assert pairs == ["attention_vs_gradient", "attention_vs_loo", "attention_vs_ig", "gradient_vs_loo"]
    assert result.summary["n"] == 12 and result.summary["excluded_short"] == 0
    for pair in pairs:
        assert -1 <= result.summary[f"tau_{pair}_mean"] <= 1
        assert 0 <= result.summary[f"tau_{pair}_significant"] <= 1
    assert result.meta["published"] == PUBLISHED
    published = {row["pair"]: row for row in result.tables["pairs"]}
    assert published["attention_vs_gradient"]["published_mean"] == 0.351
    assert {row["pred"] for row in result.tables["by_predicted_class"]} <= {"negative", "positive"}
    assert "heads" not in result.tables  # one layer, one head


def test_tau_equals_scipy_on_the_importance_vectors(bilstm: Run) -> None:
    examples = bilstm.examples("test", 6)
    result = ImportanceCorrelation().run(bilstm, examples, make_options(ImportanceCorrelation(), {"topk": 3}))
    batch = bilstm.collate(examples)
    mask = item_mask(bilstm, batch)
    attention, gradient, loo = (f(bilstm, batch) for f in (attention_importance, gradient_importance, loo_importance))
    for row in result.instances:
        real = mask[row["index"]]
        a, g, l_ = (v[row["index"]][real].double().numpy() for v in (attention, gradient, loo))
        expected = stats.kendalltau(a, g)
        assert row["tau_attention_vs_gradient"] == pytest.approx(expected.statistic)
        assert row["p_attention_vs_gradient"] == pytest.approx(expected.pvalue)
        assert row["tau_gradient_vs_loo"] == pytest.approx(stats.kendalltau(g, l_).statistic)
        top = np.union1d(np.argsort(-a, kind="stable")[:3], np.argsort(-l_, kind="stable")[:3])
        assert row["tau_topk_attention_vs_loo"] == pytest.approx(stats.kendalltau(a[top], l_[top]).statistic, nan_ok=True)


def test_tau_hand_case_per_head() -> None:
    """One discordant pair out of six: τ = (5 − 1) / 6; a reversed head gives −1."""
    heads: dict = defaultdict(list)
    pvalues: dict = defaultdict(list)
    attention = np.array([[[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]]])  # 1 layer, 2 heads
    ImportanceCorrelation._per_head(attention, {"gradient": np.array([1.0, 2.0, 4.0, 3.0])}, ["gradient"], heads, pvalues)
    assert heads[(0, 0, "gradient")] == [pytest.approx(4 / 6)]
    assert heads[(0, 1, "gradient")] == [pytest.approx(-4 / 6)]
    assert np.isnan(heads[(0, "mean", "gradient")][0])  # the head mean is constant: no ranking
    assert pvalues[(0, 0, "gradient")] == [pytest.approx(stats.kendalltau([1, 2, 3, 4], [1, 2, 4, 3]).pvalue)]


def test_transformer_per_layer_and_head(transformer: Run, tmp_path: Path) -> None:
    result = run_test("importance", transformer, limit=8, out=tmp_path, methods=["gradient", "loo"])
    heads = result.tables["heads"]
    assert len(heads) == 2 * (2 + 1) * 2  # layers x (heads + mean) x methods
    assert (tmp_path / "importance_heads.png").exists() and (tmp_path / "importance_heads.svg").exists()
    last = next(r for r in heads if r["layer"] == 1 and r["head"] == "mean" and r["method"] == "gradient")
    assert last["mean"] == pytest.approx(result.summary["tau_attention_vs_gradient_mean"])
    assert result.summary["tau_layer1_headmean_vs_loo_mean"] == pytest.approx(result.summary["tau_attention_vs_loo_mean"])


def test_short_instances_are_excluded_and_noted(bilstm: Run) -> None:
    examples = [*bilstm.examples("test", 3), Example(tokens=["pos0"], label="positive")]
    result = ImportanceCorrelation().run(bilstm, examples, make_options(ImportanceCorrelation(), {}))
    assert result.summary["excluded_short"] == 1 and len(result.instances) == 3
    assert any("excluded 1 instance" in note for note in result.meta["notes"])


def test_tagging_does_not_apply_and_bad_options_fail(bilstm: Run) -> None:
    config = ModelConfig(model="transformer", task_type="tagging", vocab_size=10, num_labels=3, embed_dim=8, d_model=8, heads=2)
    tagger = Run(model=build_model(config), collate=None, task=TaskSpec(spec="x", task_type="tagging", labels=["O"]))  # type: ignore[arg-type]
    reason = ImportanceCorrelation().applies(tagger)
    assert reason and "per token" in reason
    with pytest.raises(AttnAuditError, match="does not apply"):
        run_test("importance", tagger)
    with pytest.raises(AttnAuditError, match="unknown method"):
        run_test("importance", bilstm, limit=2, methods=["saliency"], plot=False)
    with pytest.raises(AttnAuditError, match="--topk"):
        run_test("importance", bilstm, limit=2, topk=0, plot=False)


def test_loo_tokens_is_passed_to_loo_and_noted(transformer: Run, tmp_path: Path) -> None:
    """``--loo-tokens K`` reaches the loo explanation (fewer nonzero LOO values than the exact mode) and the
    result says the LOO figures are approximate."""
    exact = run_test("importance", transformer, limit=8, out=tmp_path / "exact", methods=["gradient", "loo"], plot=False)
    approx = run_test("importance", transformer, limit=8, out=tmp_path / "approx", methods=["gradient", "loo"], loo_tokens=1, plot=False)
    assert any("APPROXIMATE (--loo-tokens 1)" in note for note in approx.meta["notes"])
    assert not any("APPROXIMATE" in note for note in exact.meta["notes"])
    assert approx.summary["tau_attention_vs_gradient_mean"] == pytest.approx(exact.summary["tau_attention_vs_gradient_mean"])
    assert approx.summary["tau_attention_vs_loo_mean"] != pytest.approx(exact.summary["tau_attention_vs_loo_mean"])
