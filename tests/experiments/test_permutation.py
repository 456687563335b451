"""Permutation test: permutation draws, batched decode vs the full-model loop, tiny runs end to end."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnaudit.data.types import Example
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.common.applies import resolve_layers
from attnaudit.experiments.common.seeding import seeded_generator
from attnaudit.experiments.experiment import Result, get_experiment
from attnaudit.experiments.permutation import (
    permutation_blocks,
    permutation_loop,
    permute_batch,
)
from attnaudit.experiments.runner import make_options, run_test
from attnaudit.progress import set_quiet
from attnaudit.run import Run

set_quiet(True)
GetRun = Callable[[str], Run]


# --------------------------------------------------------------------- permutation draws


@settings(max_examples=40, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=9), st.integers(1, 3), st.integers(0, 2**31 - 1))
def test_draw_is_a_permutation_of_real_keys_per_row(keys: list[bool], heads: int, seed: int) -> None:
    key_mask = torch.tensor(keys)
    query_rows = torch.tensor([True, False, True])
    blocks = list(permutation_blocks(key_mask, query_rows, heads, 2, 20, torch.Generator().manual_seed(seed)))
    assert [len(b) for b in blocks] == [16, 4]
    src = blocks[1][-1]
    real = key_mask.nonzero().squeeze(-1)
    identity = torch.arange(len(keys))
    assert src.shape == (2, heads, 3, len(keys))
    for layer in range(2):
        for h in range(heads):
            for q in range(3):
                row = src[layer, h, q]
                if not query_rows[q]:
                    assert torch.equal(row, identity)
                    continue
                assert torch.equal(row[real].sort().values, real)  # a permutation of the real keys
                assert torch.equal(row[~key_mask], identity[~key_mask])  # padding maps to itself


def _draw(key_mask: list[bool], seed: int) -> torch.Tensor:
    one = torch.ones(1, dtype=torch.bool)
    return torch.cat(list(permutation_blocks(torch.tensor(key_mask), one, 1, 1, 20, seeded_generator(seed, 7))))


def test_draw_does_not_depend_on_padding() -> None:
    plain = _draw([True] * 5, seed=3)
    assert torch.equal(_draw([True] * 5 + [False] * 4, seed=3)[..., :5], plain)
    assert not torch.equal(plain, _draw([True] * 5, seed=4))
    assert len({tuple(row.flatten().tolist()) for row in plain}) > 1  # the permutations differ


# --------------------------------------------------------------------- batched == per-instance loop


@pytest.mark.parametrize(
    ("name", "layer"),
    [("bilstm", "explained"), ("han", "explained"), ("pair", "explained"), ("transformer", "explained"),
     ("transformer", "all"), ("transformer", "0"), ("transformer-pair", "explained")],
)
def test_batched_decode_equals_full_model_loop(tiny_attention_run: GetRun, name: str, layer: str) -> None:
    run = tiny_attention_run(name)
    examples = run.examples("test", 5)
    layers = resolve_layers(run.model, layer)
    ours = permute_batch(run.model, run.collate(examples), layers, 6, seed=1, indices=range(5))
    loop = permutation_loop(run, examples, layers, 6, seed=1)
    np.testing.assert_allclose(ours.changes.numpy(), loop, atol=1e-5)
    assert ours.decode_calls == 1
    assert loop.max() > 0  # the tiny models are not permutation-invariant


# --------------------------------------------------------------------- end to end


@pytest.mark.parametrize("name", ["bilstm", "han", "transformer", "pair"])
def test_end_to_end_writes_per_instance_results(tiny_attention_run: GetRun, name: str, tmp_path: Path) -> None:
    run = tiny_attention_run(name)
    result = run_test("permutation", run, limit=7, seed=0, out=tmp_path, plot=name == "bilstm", permutations=9)
    loaded = Result.load(tmp_path / "permutation.json")
    assert (tmp_path / "permutation.csv").exists()
    assert len(loaded.instances) == 7 == result.summary["n"]
    for row in loaded.instances:
        assert {"index", "predicted", "max_attention", "median_change", "flip_rate"} <= set(row)
        assert 0.0 <= row["median_change"] <= row["max_change"] <= 1.0
        assert 0.0 < row["max_attention"] <= 1.0
    medians = [row["median_change"] for row in loaded.instances]
    assert loaded.summary["median_change_median"] == pytest.approx(float(np.median(medians)))
    assert loaded.summary["fraction_insensitive"] == pytest.approx(np.mean([m < 0.05 for m in medians]))
    assert loaded.meta["options"]["permutations"] == 9 and loaded.meta["published"]
    assert {r["predicted"] for r in loaded.tables["per_class"]} == {r["predicted"] for r in loaded.instances}
    if name == "bilstm":
        stems = {Path(f).name for f in loaded.figures}
        assert {"permutation_vs_max_attention.png", "permutation_histogram.svg"} <= stems
        assert all(Path(f).stat().st_size > 0 for f in loaded.figures)


def _uniform(run: Run) -> Run:
    """A copy of the run whose explained attention is uniform (constant scores)."""
    model = copy.deepcopy(run.model)
    with torch.no_grad():
        if run.family == "transformer":
            model.layers[-1].q_proj.weight.zero_()
            model.layers[-1].q_proj.bias.zero_()
        else:
            model.scorer.v.weight.zero_()
    return Run(model=model, collate=run.collate, task=run.task, device=run.device, _data=run.data())


@pytest.mark.parametrize("name", ["bilstm", "transformer"])
def test_uniform_attention_is_permutation_invariant(tiny_attention_run: GetRun, name: str, tmp_path: Path) -> None:
    run = _uniform(tiny_attention_run(name))
    result = run_test("permutation", run, limit=6, out=tmp_path, plot=False, permutations=8)
    assert all(abs(row["max_change"]) < 1e-6 for row in result.instances)
    assert result.summary["fraction_insensitive"] == 1.0
    assert all(row["flip_rate"] == 0.0 for row in result.instances)


def test_same_seed_same_numbers(tiny_attention_run: GetRun, tmp_path: Path) -> None:
    run = tiny_attention_run("bilstm")
    first = run_test("permutation", run, limit=6, seed=5, out=tmp_path / "a", plot=False, permutations=5)
    again = run_test("permutation", run, limit=6, seed=5, out=tmp_path / "b", plot=False, permutations=5)
    rebatched = run_test("permutation", run, limit=6, seed=5, out=tmp_path / "c", plot=False, permutations=5, batch_size=4)
    other = run_test("permutation", run, limit=6, seed=6, out=tmp_path / "d", plot=False, permutations=5)
    assert first.instances == again.instances
    # Other batch composition: same draws, equal up to float rounding of the padded batch.
    np.testing.assert_allclose(
        [r["mean_change"] for r in first.instances], [r["mean_change"] for r in rebatched.instances], atol=1e-6
    )
    assert [r["median_change"] for r in first.instances] != [r["median_change"] for r in other.instances]


def test_single_item_instances_are_excluded_and_counted(tiny_attention_run: GetRun) -> None:
    run = tiny_attention_run("bilstm")
    experiment = get_experiment("permutation")
    examples = [Example(tokens=["pos0"], label="positive"), *run.examples("test", 2)]
    result = experiment.run(run, examples, make_options(experiment, {"permutations": 4}), seed=0)
    assert result.summary["n_single_item"] == 1 and result.summary["n_evaluated"] == 2
    assert math.isnan(result.instances[0]["median_change"])


def test_tagging_does_not_apply(tiny_attention_run: GetRun, tmp_path: Path) -> None:
    with pytest.raises(AttnAuditError, match="tagger predicts one label per token"):
        run_test("permutation", tiny_attention_run("tagger"), limit=2, out=tmp_path)


def test_layer_option_is_validated(tiny_attention_run: GetRun, tmp_path: Path) -> None:
    transformer = tiny_attention_run("transformer")
    assert resolve_layers(transformer.model, "explained") == [1]
    assert resolve_layers(transformer.model, "all") == [0, 1]
    assert resolve_layers(transformer.model, "-2") == [0]
    with pytest.raises(AttnAuditError, match="out of range"):
        resolve_layers(transformer.model, "2")
    with pytest.raises(AttnAuditError, match="'explained', 'all' or a layer index"):
        resolve_layers(transformer.model, "last")
    with pytest.raises(AttnAuditError, match="attends within parts of the input"):
        run_test("permutation", tiny_attention_run("han"), limit=2, out=tmp_path, layer="all", plot=False)
    with pytest.raises(AttnAuditError, match="at least 1"):
        run_test("permutation", transformer, limit=2, out=tmp_path, permutations=0, plot=False)
