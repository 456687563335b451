"""Seed variance: the comparison helper, base-config reconstruction, end to end (classification, tagging), resume."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnaudit.algorithms.metrics import tvd
from attnaudit.data.synthetic import synthetic_task
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.common.measures import weighted_mean
from attnaudit.experiments.common.published import compare
from attnaudit.experiments.runner import run_test
from attnaudit.models import build_model
from attnaudit.progress import set_quiet
from attnaudit.run import Run
from attnaudit.seed import set_seed
from attnaudit.training.adversary import standard_options
from attnaudit.training.trainer import train

set_quiet(True)


@pytest.fixture(scope="module")
def clf(tmp_path_factory: pytest.TempPathFactory) -> Run:
    data = synthetic_task("classification", seed=0, n_train=160, n_dev=30, n_test=30)
    return train(
        data, "bilstm", tmp_path_factory.mktemp("seeds-clf") / "run", epochs=2, lr=1e-2, batch_size=16,
        embed_dim=16, hidden_dim=8, quiet_eval=True,
    )


@pytest.fixture(scope="module")
def tagger(tmp_path_factory: pytest.TempPathFactory) -> Run:
    data = synthetic_task("tagging", seed=0, n_train=160, n_dev=30, n_test=30)
    return train(
        data, "transformer", tmp_path_factory.mktemp("seeds-tag") / "run", epochs=2, lr=1e-2, batch_size=16,
        embed_dim=16, d_model=16, heads=2, layers=1, d_ff=32, quiet_eval=True,
    )


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(-5, 5), st.floats(0.0, 10.0)), min_size=1, max_size=12))
def test_weighted_mean_is_the_pooled_mean(pairs: list[tuple[float, float]]) -> None:
    values = np.array([v for v, _ in pairs])
    weights = np.array([w for _, w in pairs])
    expected = float((values * weights).sum() / weights.sum()) if weights.sum() > 0 else float("nan")
    got = weighted_mean(np.append(values, np.nan), np.append(weights, 3.0))  # a NaN value is left out
    assert got == pytest.approx(expected, nan_ok=True, rel=1e-9, abs=1e-9)


def test_standard_options_rebuild_the_base_run_config(clf: Run) -> None:
    metrics = Path(clf.path) / "metrics.json"
    before = metrics.stat().st_mtime_ns
    again = train(clf.data(), clf.family, clf.path, quiet_eval=True, **standard_options(clf))
    assert metrics.stat().st_mtime_ns == before  # same config hash: loaded, not retrained
    assert again.info["hash"] == clf.info["hash"]


def test_compare_with_itself_is_zero(clf: Run) -> None:
    result = compare(clf, clf.model, clf.examples("test"))
    for name in ("jsd", "kl_base_other", "kl_other_base", "tvd"):
        assert np.allclose(result[name], 0.0, atol=1e-6), name
    assert np.all(result["agreement"] == 1.0) and np.all(result["outputs"] == 1.0)
    assert np.allclose(result["max_attention_other"], result["max_attention"])


def test_compare_averages_a_taggers_outputs_over_real_tokens(tagger: Run) -> None:
    set_seed(5)
    other = build_model(tagger.config).eval()
    examples = tagger.examples("test")[:6]
    pooled = compare(tagger, other, examples, batch_size=6)
    with torch.no_grad():
        batch = tagger.collate(examples[2:3])
        change = tvd(other(batch).probs, tagger.model(batch).probs)[0]
    assert pooled["tvd"][2] == pytest.approx(float(change.mean()), abs=1e-6)  # alone == inside a padded batch
    assert pooled["outputs"][2] == len(examples[2].tokens) == pooled["rows"][2]
    assert np.all((pooled["jsd"] >= 0) & (pooled["jsd"] <= np.log(2) + 1e-9))
    with torch.no_grad():
        peak = other(batch).trace[other.explained_layer].weights.max(-1).values.mean()
    assert pooled["max_attention_other"][2] == pytest.approx(float(peak), abs=1e-6)  # heads x real rows


def test_seeds_end_to_end_skips_the_base_seed_and_resumes(clf: Run, tmp_path: Path) -> None:
    result = run_test("seeds", clf, seeds=[0, 1, 2], epochs=1, out=tmp_path)
    assert [row["seed"] for row in result.tables["seeds"]] == [1, 2]
    assert any("seed 0 skipped" in note for note in result.meta["notes"])
    first = result.instances[0]
    assert first["jsd_median"] == pytest.approx(np.median([first["jsd_seed1"], first["jsd_seed2"]]))
    assert result.summary["seeds"] == 2
    assert (tmp_path / "seeds.csv").exists() and (tmp_path / "seeds_jsd_vs_max_attention.png").exists()

    stamp = (tmp_path / "subruns" / "seeds" / "seed-1" / "metrics.json").stat().st_mtime_ns
    again = run_test("seeds", clf, seeds=[1, 2], epochs=1, out=tmp_path)
    assert [row["trained_now"] for row in again.tables["seeds"]] == [False, False]
    assert (tmp_path / "subruns" / "seeds" / "seed-1" / "metrics.json").stat().st_mtime_ns == stamp
    assert again.summary["median_jsd"] == result.summary["median_jsd"]


def test_seeds_on_a_tagger(tagger: Run, tmp_path: Path) -> None:
    result = run_test("seeds", tagger, seeds=[1], epochs=1, out=tmp_path, limit=10)
    assert len(result.instances) == 10
    assert result.summary["metric"] == "f1" and "base_test_f1" in result.summary
    assert 0.0 <= result.summary["median_jsd"] <= np.log(2)


def test_seeds_needs_another_seed(clf: Run) -> None:
    with pytest.raises(AttnAuditError, match="other than the base run's seed 0"):
        run_test("seeds", clf, seeds=[0], epochs=1, plot=False)
