"""Instance selection and heatmap data for the report."""

from __future__ import annotations

import torch

from attnaudit.experiments.experiment import Result
from attnaudit.experiments.importance import ImportanceCorrelation
from attnaudit.explain.methods.attention import attention_importance
from attnaudit.report.heatmaps import compute_heatmaps, ranking_result, select_instances


def test_selection_takes_most_and_least_faithful_by_tau() -> None:
    rows = [{"index": i, "tau_attention_vs_gradient": t, "p_attention_vs_gradient": 0.0}
            for i, t in enumerate([0.1, 0.9, None, -0.5, 0.4, -0.2])]
    importance = Result(test="importance", instances=rows)
    column = ImportanceCorrelation.settings.ranks_instances  # the test says which of its columns ranks instances
    assert column == "tau_attention_vs_gradient"
    chosen, taus, how = select_instances(importance, column, 6, 2)
    assert chosen == [1, 4, 3, 5]  # two highest τ, then the lowest and the next lowest
    assert 2 not in taus and "most and 2 least" in how and "(importance test)" in how
    assert select_instances(None, "", 10, 2)[0] == [0, 1, 2, 3]
    assert select_instances(Result(test="importance", instances=[{"index": 0, "x": 1.0}]), column, 3, 2)[0] == [0, 1, 2]


def test_the_ranking_result_is_the_stored_result_of_the_test_that_declares_a_column(tmp_path) -> None:
    assert ranking_result(tmp_path) == (None, "")
    Result(test="importance", instances=[{"index": 0, "tau_attention_vs_gradient": 0.5}]).save(tmp_path)
    result, column = ranking_result(tmp_path)
    assert result is not None and result.test == "importance" and column == "tau_attention_vs_gradient"


def test_heatmaps_hold_real_scores_for_each_item(tiny_attention_run) -> None:
    run = tiny_attention_run("transformer")
    examples = run.examples("test", 5)
    data = compute_heatmaps(run, examples, [3, 1], {3: 0.25})
    assert [d["index"] for d in data] == [3, 1] and data[0]["tau"] == 0.25 and data[1]["tau"] is None
    assert list(data[0]["scores"]) == ["attention", "gradient", "loo", "ig", "rollout", "norms"]  # the default explanations
    batch = next(run.batches([examples[3]], 1))
    expected = attention_importance(run, batch)[0, : len(examples[3].tokens)]
    assert torch.allclose(torch.tensor(data[0]["scores"]["attention"], dtype=torch.float64), expected.double(), atol=1e-6)
    assert data[0]["items"] == examples[3].tokens
    assert data[0]["rationale"] == examples[3].rationale
