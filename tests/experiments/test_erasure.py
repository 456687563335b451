"""Serrano & Smith erasure tests: erasure maths, a hand-built model, tiny trained runs end to end."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnaudit.data.batching import Collator
from attnaudit.data.synthetic import synthetic_task
from attnaudit.data.types import Example, TaskData
from attnaudit.data.vocab import Vocab
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.erasure import (
    RANDOM,
    Erasure,
    decode_erased,
    erase_items,
    flip_steps,
    order_by,
    prepare,
    random_order,
    random_other,
    stacked_flip_steps,
)
from attnaudit.experiments.experiment import Result, get_experiment
from attnaudit.experiments.runner import run_test
from attnaudit.models import ModelConfig, build_model
from attnaudit.run import Run, TaskSpec
from attnaudit.training.trainer import train

FAMILIES = ["bilstm", "han", "transformer"]
FAST_RANKINGS = ["attention", RANDOM, "gradient_x_attention"]


# --------------------------------------------------------------------- erasure maths


@settings(max_examples=30, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(2, 7),
    st.integers(0, 2**31 - 1),
)
def test_erase_items_zeroes_and_renormalises(heads: int, queries: int, keys: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    weights = torch.rand(2, heads, queries, keys, generator=g, dtype=torch.float64).softmax(-1)
    removed = torch.rand(2, keys, generator=g) < 0.5
    removed[:, 0] = False  # keep at least one item with mass
    out = erase_items(removed)(weights, torch.ones(2, keys, dtype=torch.bool))
    kept = weights * (~removed)[:, None, None, :]
    assert torch.all(out[removed[:, None, None, :].expand_as(out)] == 0)
    torch.testing.assert_close(out.sum(-1), torch.ones(2, heads, queries, dtype=torch.float64))
    torch.testing.assert_close(out, kept / kept.sum(-1, keepdim=True))


def test_erasing_the_whole_support_leaves_zeros_not_nan() -> None:
    weights = torch.tensor([[[[0.0, 1.0, 0.0]]]])
    out = erase_items(torch.tensor([[False, True, False]]))(weights, torch.ones(1, 3, dtype=torch.bool))
    assert torch.equal(out, torch.zeros_like(weights))


def test_order_by_puts_padding_last_and_breaks_ties_by_position() -> None:
    scores = torch.tensor([[0.1, 0.5, 0.5, 9.0], [-1.0, 3.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    assert order_by(scores, mask).tolist() == [[1, 2, 0, 3], [1, 2, 3, 0]]


@given(st.integers(0, 1000), st.integers(0, 500), st.integers(2, 40))
def test_random_choices_are_seeded_and_valid(seed: int, index: int, length: int) -> None:
    order = random_order(seed, index, 0, length, length + 3)
    assert sorted(order[:length]) == list(range(length)) and order[length:] == [length, length + 1, length + 2]
    assert order == random_order(seed, index, 0, length, length + 3)
    top = index % length
    other = random_other(seed, index, top, length)
    assert other != top and 0 <= other < length
    assert other == random_other(seed, index, top, length)


# --------------------------------------------------------------------- hand-built model

LABELS = ["negative", "positive"]


def hand_built_run() -> Run:
    """Average encoder + dot attention where the token ``key`` alone decides ``positive``.

    ``key`` embeds to [3, 0], fillers to [0, 0.5]; h = tanh(e); the attention query [8, 0]
    gives ``key`` score ~5.6 and fillers 0, so ``key`` takes almost all attention; the
    output is positive iff the context's first coordinate exceeds 0.1, i.e. iff ``key``
    keeps its weight. Erasing ``key`` flips the decision; erasing fillers never does.
    """
    vocab = Vocab(["key", "f1", "f2", "f3"])
    config = ModelConfig(
        model="average", task_type="classification", vocab_size=len(vocab), num_labels=2,
        embed_dim=2, hidden_dim=2, scorer="dot", dropout=0.0,
    )
    model = build_model(config)
    with torch.no_grad():
        model.embedding.weight.zero_()
        model.embedding.weight[vocab.encode(["key"])[0]] = torch.tensor([3.0, 0.0])
        for filler in ("f1", "f2", "f3"):
            model.embedding.weight[vocab.encode([filler])[0]] = torch.tensor([0.0, 0.5])
        model.encoder.proj.weight.copy_(torch.eye(2))
        model.encoder.proj.bias.zero_()
        model.scorer.query.copy_(torch.tensor([8.0, 0.0]))
        model.output.weight.copy_(torch.tensor([[0.0, 0.0], [10.0, 0.0]]))
        model.output.bias.copy_(torch.tensor([0.0, -1.0]))
    model.eval()
    task = TaskSpec(spec="hand-built", task_type="classification", labels=LABELS)
    return Run(model=model, collate=Collator(vocab, LABELS, "classification"), task=task)


HAND_EXAMPLES = [
    Example(["f1", "key", "f2", "f3"], "positive"),
    Example(["f2", "f3", "f1", "f1", "f2", "key"], "positive"),
    Example(["key", "f1"], "positive"),
    Example(["f1", "f2", "f3"], "negative"),  # no key: never flips
    Example(["key"], "positive"),  # one item: excluded
]


def test_hand_built_model_flips_after_exactly_one_attention_removal() -> None:
    run = hand_built_run()
    options = Erasure.Options(rankings=["attention", RANDOM], random_orders=3, batch_size=2)
    result = Erasure().run(run, HAND_EXAMPLES, options, seed=7)
    rows = result.instances
    assert [r["pred"] for r in rows] == ["positive"] * 3 + ["negative", "positive"]
    random_flips = 0
    for row, example in zip(rows[:3], HAND_EXAMPLES[:3]):
        n = len(example.tokens)
        key = example.tokens.index("key")
        assert row["erased_max"] == key and row["flip_max"] is True and row["flip_rand"] is False
        assert row["jsd_max"] > row["jsd_rand"] >= 0.0
        assert row["fraction_attention"] == pytest.approx(1 / n)
        assert row["removed_attention"] == 1  # the key, erased first
        for r in range(3):  # a random order flips exactly when it reaches the key, unless the key comes last
            position = random_order(7, row["index"], r, n, n).index(key)
            flips = position < n - 1
            random_flips += flips
            assert row[f"flipped_random{r}"] is flips
            assert row[f"fraction_random{r}"] == pytest.approx((position + 1) / n if flips else 1.0)
            assert row[f"removed_random{r}"] == (position + 1 if flips else None)
    assert rows[3]["flipped_attention"] is False and rows[3]["fraction_attention"] == 1.0 and rows[3]["removed_attention"] is None
    assert rows[4]["fraction_attention"] is None and rows[4]["flip_max"] is None and rows[4]["removed_attention"] is None
    s = result.summary
    assert s["excluded_length1"] == 1 and s["single_n"] == 4
    assert s["single_flip_rate_max"] == 0.75 and s["single_flip_rate_rand"] == 0.0
    assert s["flip_attention_median_fraction"] == pytest.approx(0.25)  # 1/4, 1/6, 1/2
    per_ranking = {r["ranking"]: r for r in result.tables["until_flip_summary"]}
    assert per_ranking["attention"]["flipped"] == 3 and per_ranking["attention"]["never_flipped"] == 1
    assert s["flip_attention_share_never"] == 0.25
    assert 0 < random_flips < 9  # seed 7 puts the key last in some orders
    assert per_ranking[RANDOM]["flipped"] == random_flips and per_ranking[RANDOM]["never_flipped"] == 12 - random_flips
    assert result.tables["single_flips"] == [
        {"top_flips": True, "random_flips": 0, "random_keeps": 3},
        {"top_flips": False, "random_flips": 0, "random_keeps": 1},
    ]


def test_bad_options_and_tagging_are_rejected(tmp_path: Path) -> None:
    run = hand_built_run()
    experiment = Erasure()
    with pytest.raises(AttnAuditError, match="unknown ranking"):
        experiment.run(run, HAND_EXAMPLES, Erasure.Options(rankings=["attention", "nonsense"]))
    with pytest.raises(AttnAuditError, match="--rankings: rollout does not apply to this model: .*self-attention"):
        experiment.run(run, HAND_EXAMPLES, Erasure.Options(rankings=["attention", "rollout"]))
    with pytest.raises(AttnAuditError, match="random-orders"):
        experiment.run(run, HAND_EXAMPLES, Erasure.Options(random_orders=0))
    tagger = build_model(ModelConfig(model="transformer", task_type="tagging", vocab_size=6, num_labels=3,
                                     embed_dim=8, d_model=8, heads=2, d_ff=8))
    tagging = Run(model=tagger, collate=run.collate, task=TaskSpec("t", "tagging", ["O", "B-A", "I-A"]))
    assert "tagging" in (experiment.applies(tagging) or "")
    with pytest.raises(AttnAuditError, match="does not apply"):
        run_test("erasure", tagging, out=tmp_path)


# --------------------------------------------------------------------- tiny trained runs


def _task(family: str) -> TaskData:
    """Synthetic classification; HAN gets 5-token sentences; plus one single-item test instance."""
    task = synthetic_task("classification", seed=0, n_train=200, n_dev=30, n_test=10)
    if family == "han":
        for example in task.train + task.dev + task.test:
            example.sentences = [example.tokens[i : i + 5] for i in range(0, len(example.tokens), 5)]
        task.test.append(Example(["pos0", "w001", "w002"], "positive", sentences=[["pos0", "w001", "w002"]]))
    else:
        task.test.append(Example(["pos0"], "positive"))
    return task


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    root = tmp_path_factory.mktemp("erasure-runs")
    options = {"epochs": 2, "embed_dim": 16, "hidden_dim": 8, "lr": 1e-2, "quiet_eval": True}
    extra = {"transformer": {"d_model": 16, "heads": 2, "layers": 2, "d_ff": 16, "lr": 3e-3}}
    return {f: train(_task(f), f, root / f, **{**options, **extra.get(f, {})}) for f in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_end_to_end_writes_results_and_counts_add_up(runs: dict[str, Run], family: str, tmp_path: Path) -> None:
    # Integrated gradients dominates the cost of a tiny run; it is exercised on one family.
    rankings = Erasure.Options().rankings if family == "transformer" else ["attention", RANDOM, "attention_gradient", "loo"]
    result = run_test("erasure", runs[family], split="test", out=tmp_path, random_orders=2, batch_size=8, rankings=rankings)
    n = result.summary["n"]
    assert n == 11 and result.summary["excluded_length1"] == 1
    for row in result.tables["until_flip_summary"]:
        orders = 2 if row["ranking"] == RANDOM else 1
        assert row["runs"] == (n - 1) * orders == row["flipped"] + row["never_flipped"]
        assert row["excluded_length1"] == 1
    assert [r["ranking"] for r in result.tables["until_flip_summary"]] == rankings
    fractions = [r["fraction"] for r in result.tables["until_flip"]]
    assert fractions and all(0.0 < f <= 1.0 for f in fractions)
    assert all((r["fraction"] == 1.0) != r["flipped"] or r["removed"] == r["length"] for r in result.tables["until_flip"])
    loaded = Result.load(tmp_path / "erasure.json")
    assert loaded.summary == pytest.approx(result.summary, nan_ok=True)
    assert (tmp_path / "erasure.csv").exists()
    for stem in ("erasure_single", "erasure_flip_rates", "erasure_until_flip"):
        assert (tmp_path / f"{stem}.png").stat().st_size > 0 and (tmp_path / f"{stem}.svg").exists()


def test_random_rankings_are_deterministic_given_the_seed(runs: dict[str, Run]) -> None:
    run = runs["bilstm"]
    examples = run.examples("test")
    options = Erasure.Options(rankings=[RANDOM], random_orders=3, batch_size=8)
    first = Erasure().run(run, examples, options, seed=3)
    again = Erasure().run(run, examples, options, seed=3)
    other = Erasure().run(run, examples, options, seed=4)
    columns = ["erased_rand", "jsd_rand", *(f"fraction_random{r}" for r in range(3))]
    pd.testing.assert_frame_equal(first.frame()[columns], again.frame()[columns])
    assert not first.frame()[columns].equals(other.frame()[columns])


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_equals_one_instance_at_a_time(runs: dict[str, Run], family: str) -> None:
    run = runs[family]
    examples = run.examples("test")[:8] + run.examples("test")[-1:]
    experiment = get_experiment("erasure")
    batched = experiment.run(run, examples, Erasure.Options(rankings=FAST_RANKINGS, random_orders=2, batch_size=9))
    single = experiment.run(run, examples, Erasure.Options(rankings=FAST_RANKINGS, random_orders=2, batch_size=1))
    assert batched.summary["decode_calls"] < single.summary["decode_calls"]
    for a, b in zip(batched.instances, single.instances):
        exact = {k: v for k, v in a.items() if not k.startswith(("jsd", "weight", "delta"))}
        assert exact == {k: b[k] for k in exact}
        for key in ("jsd_max", "jsd_rand", "weight_max", "weight_rand"):
            assert a[key] == pytest.approx(b[key], abs=1e-5, nan_ok=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_erasing_the_prepared_weights_equals_erasing_the_computed_ones(runs: dict[str, Run], family: str) -> None:
    """The searches erase the prepared pass's weights (given as a tensor: no scores recomputed per step);
    the output equals erasing the weights the layer computes."""
    run = runs[family]
    batch = next(run.batches(run.examples("test")[:6], 6))
    with torch.no_grad():
        explained = prepare(run, batch)
    assert explained.weights is not None
    removed = explained.mask & (torch.rand(explained.mask.shape, generator=torch.Generator().manual_seed(0)) < 0.5)
    computed = decode_erased(run.model, explained.cache, explained.layer, removed)
    given = decode_erased(run.model, explained.cache, explained.layer, removed, explained.weights)
    torch.testing.assert_close(given, computed, rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", ["transformer"])
def test_stacked_orders_flip_where_each_order_flips_alone(runs: dict[str, Run], family: str) -> None:
    """Several orders searched in one stack give each order's own flips and counts."""
    run = runs[family]
    batch = next(run.batches(run.examples("test")[:6], 6))
    with torch.no_grad():
        explained = prepare(run, batch)
    orders = [order_by(explained.attention, explained.mask)]
    for seed in (1, 2):
        noise = torch.rand(explained.mask.shape, generator=torch.Generator().manual_seed(seed))
        orders.append(order_by(noise, explained.mask))
    stacked = stacked_flip_steps(run.model, explained, orders)
    for order, together in zip(orders, stacked):
        alone = flip_steps(run.model, explained, order)
        assert torch.equal(alone.removed, together.removed) and torch.equal(alone.flipped, together.flipped)
    assert stacked[0].decode_calls <= sum(flip_steps(run.model, explained, o).decode_calls for o in orders)
