"""Shuffle: row permutations keep each row's weights, runs are seeded, uniform attention is immune."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnaudit.errors import AttnAuditError
from attnaudit.experiments.common.seeding import seeded_generator
from attnaudit.experiments.runner import make_options, run_test
from attnaudit.experiments.shuffle import Shuffle, permute_rows
from attnaudit.models.interface import Intervention
from attnaudit.run import Run


@settings(max_examples=40, deadline=None)
@given(
    mask_rows=st.lists(st.lists(st.booleans(), min_size=6, max_size=6).filter(any), min_size=1, max_size=3),
    seed=st.integers(0, 10_000),
)
def test_permutation_moves_weights_only_among_real_keys(mask_rows: list[list[bool]], seed: int) -> None:
    mask = torch.tensor(mask_rows)  # real keys need not be contiguous
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(len(mask_rows), 2, 4, 6, generator=g)
    weights = scores.masked_fill(~mask[:, None, None, :], float("-inf")).softmax(-1)
    out = permute_rows(weights, mask, seeded_generator(seed))
    assert torch.all(out[~mask[:, None, None, :].expand_as(out)] == 0)
    for b in range(len(mask_rows)):
        real = mask[b]
        before = weights[b][..., real].sort(-1).values
        after = out[b][..., real].sort(-1).values
        assert torch.equal(before, after)  # same multiset per row, exactly


@settings(max_examples=30, deadline=None)
@given(lengths=st.lists(st.integers(1, 6), min_size=1, max_size=3), seed=st.integers(0, 10_000))
def test_causal_rows_move_weight_only_among_the_keys_they_read(lengths: list[int], seed: int) -> None:
    """A decoder's query q keeps its weights on keys 0..q (itself and earlier), permuted among them."""
    mask = torch.arange(6)[None, :] < torch.tensor(lengths)[:, None]  # right padding
    readable = mask[:, None, None, :] & torch.ones(6, 6, dtype=torch.bool).tril()
    g = torch.Generator().manual_seed(seed)
    weights = torch.randn(len(lengths), 2, 6, 6, generator=g).masked_fill(~readable, float("-inf")).softmax(-1)
    out = permute_rows(weights, mask, seeded_generator(seed), causal=True)
    assert torch.all(out[~readable.expand_as(out)] == 0)
    for b in range(len(lengths)):
        for q in range(6):
            keys = readable[b, 0, q]
            assert torch.equal(weights[b, :, q][:, keys].sort(-1).values, out[b, :, q][:, keys].sort(-1).values)


def test_permutation_is_seeded_and_actually_permutes() -> None:
    weights = torch.arange(1.0, 9.0).repeat(1, 1, 50, 1)  # (1,1,50,8): 50 rows with distinct entries
    mask = torch.ones(1, 8, dtype=torch.bool)
    a = permute_rows(weights, mask, seeded_generator(3, 0, 1))
    b = permute_rows(weights, mask, seeded_generator(3, 0, 1))
    c = permute_rows(weights, mask, seeded_generator(3, 1, 1))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert not torch.equal(a, weights)
    # Every position receives every value about equally often over many rows (a uniform permutation).
    assert len({tuple(row.tolist()) for row in a[0, 0]}) > 40


def test_restarting_at_a_layer_equals_a_full_pass(tiny_transformer_run: Run) -> None:
    """The per-layer settings restart the model at the shuffled layer; that must not change the result."""
    model = tiny_transformer_run.model
    batch = next(tiny_transformer_run.batches(tiny_transformer_run.examples("test", 8), 8))
    with torch.no_grad():
        cache = model.encode(batch)
        base = model.decode(cache)
        gens = [seeded_generator(0, 0, 1), seeded_generator(0, 0, 1)]
        full = model.decode(cache, [Intervention(layer=1, weights=lambda w, m: permute_rows(w, m, gens[0]))])
        restarted = model.decode(
            model.cache_at(base.trace, 1, cache), [Intervention(layer=1, weights=lambda w, m: permute_rows(w, m, gens[1]))]
        )
    torch.testing.assert_close(full.logits, restarted.logits)


def test_run_is_seeded_and_reports_every_setting(tiny_transformer_run: Run, tmp_path: Path) -> None:
    first = run_test("shuffle", tiny_transformer_run, out=tmp_path / "a", seed=4, repeats=2, batch_size=16, show=2)
    again = run_test("shuffle", tiny_transformer_run, out=tmp_path / "b", seed=4, plot=False, repeats=2, batch_size=16, show=2)
    assert first.summary == again.summary and first.instances == again.instances
    assert [r["setting"] for r in first.tables["settings"]] == ["layer0", "layer1", "all"]
    for row in first.tables["settings"]:
        assert 0.0 <= row["accuracy_mean"] <= 1.0 and row["repeats"] == 2
    assert first.summary["drop_all_mean"] == pytest.approx(
        first.summary["accuracy_original"] - first.summary["accuracy_shuffle_all_mean"]
    )
    assert first.meta["published"]["shuffle_drop_points"] == {"softmax": 7.0, "entmax15": 26.75}
    settings_seen = {r["setting"] for r in first.tables["attention_examples"]}
    assert settings_seen == {"original", "shuffled (all layers)"}
    assert {Path(p).name for p in first.figures} >= {"shuffle.png", "shuffle-attention.png"}


def test_uniform_attention_is_unchanged_by_shuffling(tiny_transformer_run: Run) -> None:
    """With zero query projections every score is equal, attention is uniform and shuffling is a no-op."""
    run = copy.copy(tiny_transformer_run)
    run.model = copy.deepcopy(tiny_transformer_run.model)
    with torch.no_grad():
        for layer in run.model.layers:
            layer.q_proj.weight.zero_()
            layer.q_proj.bias.zero_()
    experiment = Shuffle()
    result = experiment.run(run, run.examples("test", 24), make_options(experiment, {"repeats": 2}), seed=1)
    for row in result.tables["settings"]:
        assert row["accuracy_mean"] == pytest.approx(result.summary["accuracy_original"], abs=1e-9)
        assert row["accuracy_std"] == pytest.approx(0.0, abs=1e-9)


def test_bad_repeats_is_a_one_line_error(tiny_transformer_run: Run) -> None:
    experiment = Shuffle()
    with pytest.raises(AttnAuditError, match="--repeats must be at least 1"):
        experiment.run(tiny_transformer_run, tiny_transformer_run.examples("test", 2), make_options(experiment, {"repeats": 0}))
