"""Global adversary: the KL/TVD/NLL objectives on hand cases, the breakpoint fit, both variants end to end."""

from __future__ import annotations

import dataclasses
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attnaudit.algorithms.metrics import kl
from attnaudit.data.synthetic import synthetic_task
from attnaudit.data.types import Batch
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.global_adversary import breakpoint_fit, entry_scale, nll_breakpoint
from attnaudit.experiments.runner import run_test
from attnaudit.models.interface import AttentionLayer, AttentionTrace, ModelOutput
from attnaudit.progress import set_quiet
from attnaudit.run import Run
from attnaudit.training.adversary import train_variant
from attnaudit.training.attention_adversaries import adversary_variant, classification_loss, differentiable_kl, tagging_loss
from attnaudit.training.trainer import train

set_quiet(True)


@pytest.fixture(scope="module")
def clf(tmp_path_factory: pytest.TempPathFactory) -> Run:
    data = synthetic_task("classification", seed=0, n_train=200, n_dev=30, n_test=30)
    return train(
        data, "bilstm", tmp_path_factory.mktemp("adv-clf") / "run", epochs=3, lr=1e-2, batch_size=16,
        embed_dim=16, hidden_dim=8, quiet_eval=True,
    )


@pytest.fixture(scope="module")
def tagger(tmp_path_factory: pytest.TempPathFactory) -> Run:
    data = synthetic_task("tagging", seed=0, n_train=160, n_dev=30, n_test=30)
    return train(
        data, "transformer", tmp_path_factory.mktemp("adv-tag") / "run", epochs=2, lr=1e-2, batch_size=16,
        embed_dim=16, d_model=16, heads=2, layers=1, d_ff=32, quiet_eval=True,
    )


# ------------------------------------------------------------------------- divergence


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 6).flatmap(lambda n: st.tuples(*[st.lists(st.sampled_from([0.0, 0.1, 0.5, 1.0, 2.0]), min_size=n, max_size=n)] * 2)))
def test_differentiable_kl_equals_metrics_kl_with_finite_gradients(pair: tuple[list[float], list[float]]) -> None:
    raw_p = torch.tensor(pair[0], dtype=torch.float64)
    raw_q = torch.tensor(pair[1], dtype=torch.float64)
    if raw_p.sum() == 0 or raw_q.sum() == 0:
        return
    leaf = raw_p.clone().requires_grad_(True)
    p = leaf / leaf.sum()  # exact zeros where raw_p is 0, as at padding
    q = raw_q / raw_q.sum()  # zeros allowed: both smooth q the same way
    value = differentiable_kl(p, q)
    assert float(value.detach()) == pytest.approx(float(kl(p.detach(), q)), rel=1e-9, abs=1e-9)
    value.backward()
    assert torch.isfinite(leaf.grad).all()


def test_differentiable_kl_gradient_through_masked_softmax_is_finite() -> None:
    logits = torch.tensor([[1.0, 2.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[True, True, False]])
    p = torch.softmax(logits.masked_fill(~mask, -1e9), -1) * mask
    differentiable_kl(p, torch.tensor([[0.5, 0.5, 0.0]])).sum().backward()
    assert torch.isfinite(logits.grad).all()


# ------------------------------------------------------------------------- hand cases


class Fixed(nn.Module):
    """A stand-in base/adversary returning fixed logits and one fixed attention layer."""

    explained_layer = 0

    def __init__(self, logits: list, weights: list, mask: list, query_mask: list | None = None) -> None:
        super().__init__()
        self.logits = torch.tensor(logits, dtype=torch.float64)
        self.weights = torch.tensor(weights, dtype=torch.float64)
        self.mask = torch.tensor(mask)
        self.query_mask = None if query_mask is None else torch.tensor(query_mask)

    def forward(self, batch: Batch, interventions: tuple = ()) -> ModelOutput:
        layer = AttentionLayer(weights=self.weights, mask=self.mask, inputs=self.weights, query_mask=self.query_mask)
        return ModelOutput(self.logits, AttentionTrace([layer]))


def test_classification_objective_on_a_hand_case() -> None:
    mask = [[True, True, False], [True, True, False]]
    base = Fixed([[0.0, 0.0], [1.0, 0.0]], [[[[0.5, 0.5, 0.0]]], [[[0.2, 0.8, 0.0]]]], mask)
    adv = Fixed([[math.log(3.0), 0.0], [1.0, 0.0]], [[[[0.75, 0.25, 0.0]]], [[[0.2, 0.8, 0.0]]]], mask)
    batch = Batch(tokens=torch.ones(2, 3, dtype=torch.long), mask=torch.tensor(mask))
    # instance 1: TVD([.75,.25],[.5,.5]) = .25, KL(adv‖base) = .75 ln 1.5 + .25 ln .5; instance 2: identical -> 0, 0
    kl_1 = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    for lam in (0.0, 0.1, 2.0):
        loss = classification_loss(base, lam)(batch, adv(batch))
        assert float(loss) == pytest.approx((0.25 - lam * kl_1) / 2, abs=1e-8)


def test_tagging_objective_on_a_hand_case() -> None:
    mask = [[True, True, False]]
    # base tags: token 0 -> 0, token 1 -> 1 (the padding position's logits must not count)
    base_logits = [[[2.0, 0.0], [0.0, 2.0], [5.0, 0.0]]]
    adv_logits = [[[0.0, 0.0], [0.0, math.log(3.0)], [-9.0, 9.0]]]
    base_w = [[[[0.5, 0.5, 0.0], [1.0, 0.0, 0.0], [0.5, 0.5, 0.0]]]]
    adv_w = [[[[0.75, 0.25, 0.0], [0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]]]
    base = Fixed(base_logits, base_w, mask, query_mask=mask)
    adv = Fixed(adv_logits, adv_w, mask, query_mask=mask)
    batch = Batch(tokens=torch.ones(1, 3, dtype=torch.long), mask=torch.tensor(mask))
    nll = (math.log(2.0) - math.log(0.75)) / 2
    kl_rows = [0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25), math.log(2.0)]  # KL(base‖adv), real rows only
    for lam in (0.0, 0.2, 3.0):
        loss = tagging_loss(base, lam)(batch, adv(batch))
        assert float(loss) == pytest.approx(nll - lam * sum(kl_rows) / 2, abs=1e-8)
        # entry scale: the same KL sum over the 1 head × 2 × 2 real attention entries
        entry = tagging_loss(base, lam, "entry")(batch, adv(batch))
        assert float(entry) == pytest.approx(nll - lam * sum(kl_rows) / 4, abs=1e-8)
    with pytest.raises(AttnAuditError, match="--kl-scale"):
        tagging_loss(base, 1.0, "row")


def test_entry_scale_pools_like_kl_div_mean() -> None:
    # two sentences (n = 2 and 3) of one head: kl_div(reduction="mean") over their attention entries
    rows = np.array([2.0, 3.0])
    per_token = np.array([0.4, 0.9])  # mean KL per row of each sentence
    assert entry_scale(per_token, rows) == pytest.approx((0.4 * 2 + 0.9 * 3) / (4 + 9))
    p = torch.tensor([[0.5, 0.5], [0.9, 0.1]])
    q = torch.tensor([[0.2, 0.8], [0.6, 0.4]])
    with warnings.catch_warnings():  # torch warns that "mean" divides by the support size: that is the point
        warnings.simplefilter("ignore", UserWarning)
        reference = torch.nn.functional.kl_div(q.log(), p, reduction="mean")  # mean over the 2 × 2 entries
    per_row = (p * (p / q).log()).sum(-1).mean()
    assert entry_scale(np.array([float(per_row)]), np.array([2.0])) == pytest.approx(float(reference), rel=1e-6)


# ------------------------------------------------------------------------- breakpoint


def test_breakpoint_of_an_exact_hinge() -> None:
    x = np.array([0.05, 0.15, 0.25, 0.4, 0.6, 0.9])
    y = 0.2 + 0.1 * x + 4.0 * np.maximum(0.0, x - 0.33)
    fit = breakpoint_fit(x, y, grid=1001)
    assert fit["breakpoint"] == pytest.approx(0.33, abs=2e-3)
    assert fit["slope_before"] == pytest.approx(0.1, abs=0.05) and fit["slope_after"] == pytest.approx(4.1, abs=0.05)


@settings(max_examples=30, deadline=None)
@given(st.floats(0.12, 0.78), st.floats(0.5, 5.0), st.floats(-1.0, 1.0))
def test_breakpoint_recovers_any_inner_kink(x0: float, rise: float, slope: float) -> None:
    x = np.linspace(0.0, 1.0, 11)
    y = slope * x + rise * np.maximum(0.0, x - x0)
    assert breakpoint_fit(x, y, grid=801)["breakpoint"] == pytest.approx(x0, abs=2e-3)


def test_no_breakpoint_when_kl_is_flat_or_nll_does_not_rise() -> None:
    saturated = np.array([21.33, 21.35, 21.35, 21.36, 21.36])  # every λ drove attention off the support
    fit = nll_breakpoint(saturated, np.array([0.37, 0.37, 0.371, 0.369, 0.371]))
    assert fit["flat"] and math.isnan(fit["breakpoint"])
    x = np.array([0.1, 0.3, 0.5, 0.7, 0.9])
    assert math.isnan(nll_breakpoint(x, 1.0 - x)["breakpoint"])  # falls, never rises
    rising = nll_breakpoint(x, 0.1 * x + 3.0 * np.maximum(0.0, x - 0.5))
    assert not rising["flat"] and rising["breakpoint"] == pytest.approx(0.5, abs=0.01)


def test_breakpoint_needs_four_points() -> None:
    assert math.isnan(breakpoint_fit(np.array([0.1, 0.2, 0.3]), np.array([1.0, 2.0, 5.0]))["breakpoint"])


# ------------------------------------------------------------------------- end to end


def test_classification_sweep_with_seed_and_uniform_points(clf: Run, tmp_path: Path) -> None:
    run_test("seeds", clf, seeds=[1], epochs=1, out=tmp_path, plot=False)
    run_test("uniform", clf, epochs=1, out=tmp_path, plot=False)
    result = run_test("global-adversary", clf, lambdas=[0.0, 10.0], epochs=2, out=tmp_path)
    rows = {row["lambda"]: row for row in result.tables["lambdas"]}
    assert set(rows) == {0.0, 10.0}
    assert rows[10.0]["mean_kl"] > rows[0.0]["mean_kl"] + 0.1  # the -λ·KL term pushes attention away
    kinds = sorted(p["kind"] for p in result.tables["reference_points"])
    assert kinds == ["seed", "uniform"]
    assert {"jsd@0", "tvd@10", "accuracy@10"} <= set(result.summary)
    assert (tmp_path / "global_adversary_jsd_vs_tvd.png").exists()
    assert "jsd_lambda10" in result.instances[0]
    example = result.meta["example_attention"]
    assert list(example["weights"]) == ["base", "λ=0", "λ=10"] and (tmp_path / "global_adversary_attention.png").exists()
    base = np.asarray(example["weights"]["base"])  # single-query attention: (1 head, 1 query, keys)
    assert base.shape == (1, 1, len(example["tokens"])) and base.sum() == pytest.approx(1.0, abs=1e-5)

    sub = tmp_path / "subruns" / "global-adversary" / "lambda-10-seed-0" / "metrics.json"
    stamp = sub.stat().st_mtime_ns
    again = run_test("global-adversary", clf, lambdas=[10.0], epochs=2, out=tmp_path, plot=False)
    assert again.tables["lambdas"][0]["trained_now"] is False and sub.stat().st_mtime_ns == stamp
    assert again.tables["lambdas"][0]["mean_jsd"] == rows[10.0]["mean_jsd"]


def test_tagging_sweep_reports_kl_nll_and_breakpoint(tagger: Run, tmp_path: Path) -> None:
    result = run_test("global-adversary", tagger, lambdas=[0.2, 0.5, 1.0, 2.0], epochs=1, out=tmp_path, limit=12)
    s = result.summary
    assert {"f1@0.2", "kl@2", "nll@0.5", "breakpoint_kl", "base_test_f1"} <= set(s)
    assert result.meta["published"]["breakpoint_kl"] == 0.33 and result.meta["published"]["f1@3"] == 0.75
    kls = [row["mean_kl"] for row in result.tables["lambdas"]]
    assert min(kls) <= s["breakpoint_kl"] <= max(kls) or math.isnan(s["breakpoint_kl"])
    assert all(row["mean_nll"] >= 0 for row in result.tables["lambdas"])
    peaks = [row["mean_max_attention"] for row in result.tables["lambdas"]] + [s["base_mean_max_attention"]]
    assert all(0 < peak <= 1 for peak in peaks)
    assert (tmp_path / "global_adversary_nll_vs_kl.png").exists()
    assert any("piecewise-linear" in note for note in result.meta["notes"])
    example = result.meta["example_attention"]
    n = len(example["tokens"])
    for weights in example["weights"].values():  # self-attention: (heads, n, n), each row a distribution
        rows = np.asarray(weights)
        assert rows.shape == (tagger.config.heads, n, n) and np.allclose(rows.sum(-1), 1.0, atol=1e-5)
    assert (tmp_path / "global_adversary_attention.png").exists()


def test_entry_scale_sweep_has_its_own_subruns_and_axis(tagger: Run, clf: Run, tmp_path: Path) -> None:
    result = run_test("global-adversary", tagger, lambdas=[0.2, 3.0], epochs=1, kl_scale="entry", out=tmp_path, limit=12)
    root = tmp_path / "subruns" / "global-adversary"
    assert (root / "lambda-3-seed-0-from-base-kl-entry" / "metrics.json").exists()
    row = result.tables["lambdas"][1]
    assert result.summary["kl_scale"] == "entry" and result.summary["kl@3"] == row["mean_kl_entry"]
    assert 0 < row["mean_kl_entry"] < row["mean_kl"]  # divided by sentence lengths > 1
    probe = run_test("probe", tagger, lambdas=[3.0], variants=["frozen"], epochs=1, adversary_kl_scale="entry",
                     out=tmp_path, plot=False, limit=12)
    assert "adversary λ=3 (entry KL)/frozen" in probe.summary
    with pytest.raises(AttnAuditError, match="tagging objective only"):
        adversary_variant(clf, 0.1, "scratch", "entry")


def test_tagging_adversary_starts_from_the_base_by_default(tagger: Run, tmp_path: Path) -> None:
    fine_tuned = run_test("global-adversary", tagger, lambdas=[0.2], epochs=1, out=tmp_path, plot=False, limit=12)
    run_test("global-adversary", tagger, lambdas=[0.2], epochs=1, init="scratch", out=tmp_path, plot=False, limit=12)
    root = tmp_path / "subruns" / "global-adversary"
    assert (root / "lambda-0.2-seed-0-from-base" / "metrics.json").exists() and (root / "lambda-0.2-seed-0" / "metrics.json").exists()
    assert any("from the base model" in note for note in fine_tuned.meta["notes"])
    with pytest.raises(AttnAuditError, match="--init"):
        run_test("global-adversary", tagger, lambdas=[0.2], epochs=1, init="bogus", plot=False)


def test_a_started_model_begins_with_the_base_weights(tagger: Run, tmp_path: Path) -> None:
    variant = adversary_variant(tagger, 0.2, "base")
    assert variant.start is tagger.model and variant.key["init"] == "base"
    assert "init" not in adversary_variant(tagger, 0.2, "scratch").key  # scratch sub-runs keep their earlier hash
    # a loss with zero gradient leaves Adam (no weight decay here) where it started: exactly the base
    frozen = dataclasses.replace(variant, loss=lambda batch, output: output.logits.sum() * 0.0)
    sub = train_variant(tagger, tmp_path / "start", frozen, epochs=1)
    for name, value in tagger.model.state_dict().items():
        torch.testing.assert_close(sub.model.state_dict()[name], value, rtol=0, atol=0)


def test_probes_of_differently_started_adversaries_do_not_share_subruns(tagger: Run, tmp_path: Path) -> None:
    common = {"lambdas": [3.0], "variants": ["frozen"], "epochs": 1, "adversary_kl_scale": "entry", "plot": False, "limit": 12}
    from_base = run_test("probe", tagger, out=tmp_path, **common)
    scratch = run_test("probe", tagger, out=tmp_path, adversary_init="scratch", **common)
    root = tmp_path / "subruns" / "probe"
    assert (root / "adversary-3-kl-entry-frozen-seed-0").is_dir()
    assert (root / "adversary-3-kl-entry-init-scratch-frozen-seed-0").is_dir()
    assert "adversary λ=3 (entry KL, scratch init)/frozen" in scratch.summary
    again = run_test("probe", tagger, out=tmp_path, **common)  # the base-started probe was not overwritten
    assert not any(row["trained_now"] for row in again.tables["probes"])
    assert again.summary == from_base.summary


def test_probes_of_adversaries_of_another_seed_do_not_share_subruns(tagger: Run, tmp_path: Path) -> None:
    common = {"lambdas": [3.0], "variants": ["frozen"], "epochs": 1, "plot": False, "limit": 12}
    first = run_test("probe", tagger, out=tmp_path, **common)
    other = run_test("probe", tagger, out=tmp_path, seed=1, **common)
    root = tmp_path / "subruns"
    assert (root / "global-adversary" / "lambda-3-seed-1-from-base").is_dir()
    assert (root / "probe" / "adversary-3-adversary-seed-1-frozen-seed-0").is_dir()
    assert "adversary λ=3 (adversary seed 1)/frozen" in other.summary
    again = run_test("probe", tagger, out=tmp_path, **common)  # the seed-0 adversary's probe was kept
    assert not any(row["trained_now"] for row in again.tables["probes"])
    assert again.summary == first.summary
