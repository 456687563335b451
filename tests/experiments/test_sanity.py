"""Sanity checks (Adebayo et al. 2018): layer order, randomisation, similarity measures, verdicts, every family."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy import stats

from attnaudit.algorithms.randomisation import (
    Block,
    Randomiser,
    block_values,
    discrete_entropy,
    grouped,
    layers_top_down,
    relative_rise,
    spearman_abs,
    topk_intersection,
)
from attnaudit.data.synthetic import synthetic_task
from attnaudit.errors import AttnAuditError
from attnaudit.experiments import run_test
from attnaudit.experiments.sanity import other_classes, permuted_labels, verdict
from attnaudit.hf import load_hf
from attnaudit.models.interface import evaluation
from attnaudit.progress import set_quiet
from attnaudit.run import Run
from attnaudit.training.trainer import train
from tests.reliability.helpers import in_process, written

set_quiet(True)
QUICK = {"variants": ["cascading"], "no_random_logit": True, "no_data_randomisation": True, "resamples": 200}


def _layers(run: Run):  # type: ignore[no-untyped-def]
    batch = next(run.batches(run.examples("test")[:4], 4))
    with evaluation(run.model):
        return layers_top_down(run.model, lambda: run.model(batch))


def _changed(model: torch.nn.Module, original: dict[str, torch.Tensor]) -> set[str]:
    return {name for name, p in model.named_parameters() if not torch.equal(p.detach(), original[name])}


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


@pytest.fixture(scope="module")
def sparsemax_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    data = synthetic_task("classification", seed=0, n_train=160, n_dev=20, n_test=20)
    return train(data, "transformer", tmp_path_factory.mktemp("sparsemax") / "run", epochs=2, lr=3e-3, d_model=16, heads=2,
                 layers=2, embed_dim=16, d_ff=32, attention="sparsemax", quiet_eval=True)


@pytest.fixture(scope="module")
def hf_run(tiny_hf: SimpleNamespace) -> Run:
    return load_hf(tiny_hf.dir, task=tiny_hf.task(), device="cpu")


# --------------------------------------------------------------------------- layers and randomisation


def test_layers_are_ordered_top_down_by_the_forward_pass(tiny_attention_run, hf_run: Run) -> None:  # type: ignore[no-untyped-def]
    blocks, uncalled = _layers(tiny_attention_run("transformer"))
    assert [b.name for b in blocks] == ["classifier", "layers.1", "layers.0", "embed_norm", "embedding"]
    assert "layers.1.ffn.0" in blocks[1].modules and uncalled == []
    blocks, _ = _layers(tiny_attention_run("bilstm"))
    assert [b.name for b in blocks] == ["output", "scorer.v", "scorer.key_proj", "encoder.rnn", "embedding"]
    blocks, _ = _layers(hf_run)
    names = [b.name for b in blocks]
    assert names[:2] == ["hf.classifier", "hf.bert.pooler.dense"] and names[-1] == "hf.bert.embeddings.word_embeddings"
    assert names.index("hf.bert.encoder.layer.1") < names.index("hf.bert.encoder.layer.0") < names.index("hf.bert.embeddings.LayerNorm")


def test_cascading_randomises_cumulatively_from_the_top(tiny_attention_run) -> None:  # type: ignore[no-untyped-def]
    run = tiny_attention_run("transformer")
    blocks, _ = _layers(run)
    before = _state(run.model)
    rand = Randomiser(run.model, blocks, seed=3)
    original = {name: p.detach().clone() for name, p in rand.model.named_parameters()}
    owners = {name: b.name for b in blocks for m in b.modules for name, _ in rand.model.get_submodule(m).named_parameters(prefix=m, recurse=False)}
    expected: set[str] = set()
    for step, block, params in rand.cascading(1):
        assert block is blocks[step - 1]
        expected |= {name for name, owner in owners.items() if owner == block.name}
        assert params == expected  # exactly the top `step` blocks hold drawn values
        assert _changed(rand.model, original) == expected  # ... and no other parameter moved
    assert expected == set(original)  # the last step randomised every parameter
    after = _state(run.model)
    assert all(torch.equal(before[k], after[k]) for k in before)  # the caller's model was never touched


def test_independent_randomises_exactly_one_layer_at_a_time(tiny_attention_run) -> None:  # type: ignore[no-untyped-def]
    run = tiny_attention_run("bilstm")
    blocks, _ = _layers(run)
    rand = Randomiser(run.model, blocks, seed=0)
    original = {name: p.detach().clone() for name, p in rand.model.named_parameters()}
    for _step, block, params in rand.independent(1):
        own = {f"{m}.{n}" for m in block.modules for n, _ in rand.model.get_submodule(m).named_parameters(recurse=False)}
        assert params == own
        assert _changed(rand.model, original) == own  # every other layer back at its original values
    rand.state({})
    assert _changed(rand.model, original) == set()


def test_grouped_layers_randomise_together(tiny_attention_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run = tiny_attention_run("transformer")
    blocks, _ = _layers(run)
    groups = grouped(blocks, 2)
    assert [g.name for g in groups] == ["classifier … layers.1", "layers.0 … embed_norm", "embedding"]
    assert groups[0].modules == blocks[0].modules + blocks[1].modules
    result = run_test("sanity", run, out=tmp_path, limit=4, plot=False, methods=["gradient"], group=2, **QUICK)
    assert [b["block"] for b in result.tables["blocks"]] == [g.name for g in groups] and result.summary["layers"] == 3
    single = run_test("sanity", run, out=tmp_path / "one", limit=4, plot=False, methods=["gradient"], **QUICK)
    # the draws are per module, so the fully randomised model (and its verdict) is the same however layers are grouped
    keys = ("verdict", "spearman_full", "floor", "topk_full", "emprt_rise")
    assert [[row[k] for k in keys] for row in result.tables["methods"]] == [[row[k] for k in keys] for row in single.tables["methods"]]


def test_draws_are_seeded_per_module_and_use_reset_parameters(tiny_attention_run) -> None:  # type: ignore[no-untyped-def]
    run = tiny_attention_run("bilstm")
    blocks, _ = _layers(run)
    top = blocks[0]
    a, how = block_values(run.model, top, seed=1, draw=1)
    b, _ = block_values(run.model, top, seed=1, draw=1)
    c, _ = block_values(run.model, top, seed=1, draw=2)
    assert how == {"output": "reset_parameters"}
    assert all(torch.equal(a[k], b[k]) for k in a) and not all(torch.equal(a[k], c[k]) for k in a)
    bound = 1 / math.sqrt(run.model.get_submodule("output").in_features)  # Linear.reset_parameters: U(-1/sqrt(fan_in), ...)
    assert float(a["output.weight"].abs().max()) <= bound


def test_a_bare_parameter_is_drawn_normal_with_the_original_spread() -> None:
    class Scale(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gain = torch.nn.Parameter(torch.linspace(-3, 3, 2000))

    values, how = block_values(Scale(), Block("", ("",)), seed=0, draw=1)
    assert how == {"": "normal"}
    assert float(values["gain"].std()) == pytest.approx(float(torch.linspace(-3, 3, 2000).std()), rel=0.1)


# --------------------------------------------------------------------------- similarity and complexity


def test_similarities_by_hand_and_against_scipy() -> None:
    a, b = np.array([0.1, -0.9, 0.5, 0.0]), np.array([1.0, 3.0, -2.0, 0.5])
    assert spearman_abs(a, b) == pytest.approx(stats.spearmanr(np.abs(a), np.abs(b))[0])
    assert spearman_abs(a, -a) == pytest.approx(1.0)  # absolute scores: the sign does not matter
    assert math.isnan(spearman_abs(np.ones(3), b[:3])) and math.isnan(spearman_abs(a[:1], b[:1]))
    # top-2 of |a|: items 1, 2; of |b|: items 1, 2 -> 1; top-1: item 1 vs item 1 -> 1; top-3: {1,2,0} vs {1,2,0}
    assert topk_intersection(a, b, 2) == 1.0 and topk_intersection(a, np.array([0, 0, 1, 2]), 2) == 0.5
    assert topk_intersection(a, b, 10) == 1.0  # k capped at the instance's length
    # two bins over [0, 1]: {0, 0.1, 0} | {1, 0.9} -> counts 3, 2
    assert discrete_entropy(np.array([0.0, -0.1, 0.0, 1.0, 0.9]), 2) == pytest.approx(stats.entropy([3, 2]))
    assert relative_rise(2.0, 3.0) == 0.5 and math.isnan(relative_rise(0.0, 1.0))


@settings(max_examples=60, deadline=None)
@given(arrays(np.float64, st.integers(2, 30), elements=st.floats(-10, 10, allow_nan=False)), st.integers(1, 8), st.data())
def test_similarity_properties(a: np.ndarray, k: int, data: st.DataObject) -> None:
    b = data.draw(arrays(np.float64, a.shape, elements=st.floats(-10, 10, allow_nan=False)))
    top = topk_intersection(a, b, k)
    assert 0.0 <= top <= 1.0 and topk_intersection(a, a, k) == 1.0
    rho = spearman_abs(a, b)
    if not math.isnan(rho):
        assert rho == pytest.approx(stats.spearmanr(np.abs(a), np.abs(b))[0]) and rho == pytest.approx(spearman_abs(b, a))
    assert discrete_entropy(a, 5) <= math.log(5) + 1e-12


def test_verdict_passes_at_the_floor_and_fails_above_it_or_unchanged() -> None:
    rng = np.random.default_rng(0)
    floor = rng.normal(0, 0.2, 40)
    assert verdict(floor + rng.normal(0, 0.05, 40), floor, 0.1, 0, 200)["verdict"] == "passes"
    high = verdict(np.full(40, 0.7) + rng.normal(0, 0.05, 40), floor, 0.1, 0, 200)
    assert high["verdict"] == "fails" and "stays above the floor" in high["reason"]
    same = verdict(np.ones(40), np.ones(40), 0.1, 0, 200)
    assert same["verdict"] == "fails" and "barely changes" in same["reason"]


def test_random_other_class_and_permuted_labels(tiny_attention_run) -> None:  # type: ignore[no-untyped-def]
    predicted = [0, 1, 2, 2, 1, 0] * 5
    others = other_classes(predicted, 3, seed=4)
    assert all(o != p and 0 <= o < 3 for o, p in zip(others, predicted)) and others == other_classes(predicted, 3, seed=4)
    assert len(set(others)) == 3
    run = tiny_attention_run("bilstm")
    permuted = permuted_labels(run, seed=0).data()
    original = run.data()
    assert sorted(e.label for e in permuted.train) == sorted(e.label for e in original.train)  # the same labels, reassigned
    assert [e.label for e in permuted.train] != [e.label for e in original.train]
    assert [e.tokens for e in permuted.train] == [e.tokens for e in original.train] and permuted.test is original.test


# --------------------------------------------------------------------------- the test end to end


def test_random_scores_fail_and_gradient_passes_on_a_trained_model(tiny_attention_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run = tiny_attention_run("bilstm")
    before = _state(run.model)
    result = run_test("sanity", run, out=tmp_path, limit=16, methods=["gradient", "random"], **QUICK)
    rows = {row["method"]: row for row in result.tables["methods"]}
    assert rows["random"]["verdict"] == "fails" and rows["random"]["spearman_full"] == 1.0 and rows["random"]["floor"] == 1.0
    assert rows["gradient"]["verdict"] == "passes", rows["gradient"]
    assert rows["gradient"]["spearman_full"] < 0.5
    after = _state(run.model)
    assert all(torch.equal(before[k], after[k]) for k in before)  # the caller's model is unchanged
    layers = [r for r in result.tables["layers"] if r["method"] == "gradient"]
    assert [r["step"] for r in layers] == list(range(6)) and layers[0]["spearman"] == 1.0
    assert (tmp_path / "sanity.json").exists() and (tmp_path / "sanity_layers.png").exists()
    per_instance = [row["spearman_full_gradient"] for row in result.instances]
    assert len(per_instance) == 16 and np.nanmean(per_instance) == pytest.approx(rows["gradient"]["spearman_full"])
    again = run_test("sanity", run, out=tmp_path / "again", limit=16, methods=["gradient", "random"], plot=False, **QUICK)
    assert again.tables == result.tables and again.instances == result.instances  # determinism under the seed


@pytest.mark.parametrize("family", ["sparsemax", "hf"])
def test_every_family_through_the_interface(family: str, sparsemax_run: Run, hf_run: Run, tmp_path: Path) -> None:
    run = sparsemax_run if family == "sparsemax" else hf_run
    result = run_test("sanity", run, out=tmp_path, limit=6, plot=False, methods=["attention", "gradient"],
                      variants=["cascading", "independent"], resamples=200, epochs=1)
    rows = {row["method"]: row for row in result.tables["methods"]}
    assert set(rows) == {"attention", "gradient"}
    assert rows["gradient"]["spearman_full"] < 0.9 and rows["attention"]["spearman_full"] < 0.9  # the copy's weights are the ones explained
    logit = {row["method"]: row["random_logit"] for row in result.tables["methods"]}
    assert logit["attention"].startswith("does not apply")
    if family == "hf":
        assert result.summary["data_randomisation"].startswith("not run:") and "Hugging Face" in result.summary["data_randomisation"]
        assert math.isnan(result.tables["methods"][0]["data_spearman"])
    else:
        assert result.summary["data_randomisation"] == "trained"
        assert np.isfinite(result.tables["methods"][1]["data_spearman"])
        assert (tmp_path / "subruns" / "sanity" / "permuted-labels-seed-0" / "metrics.json").exists()
        resumed = run_test("sanity", run, out=tmp_path, limit=6, plot=False, methods=["gradient"], variants=["independent"],
                           resamples=200, epochs=1)
        assert resumed.summary["data_randomisation"] == "loaded"  # the finished sub-run is reused, not retrained


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--topk", "0"], "--topk must be at least 1"),
        (["--group", "0"], "--group must be at least 1"),
        (["--variants", "sideways"], "unknown variant 'sideways'"),
        (["--tolerance", "1.5"], "--tolerance must be in [0, 1)"),
        (["--methods", "alti"], "alti does not apply to this model"),
        (["--methods", "nonsense"], "--methods"),
    ],
)
def test_bad_options_one_line_exit_2_nothing_written(args: list[str], message: str, tiny_attention_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run = tiny_attention_run("bilstm")
    out = tmp_path / "out"
    code, _out, err = in_process(["run", "sanity", str(run.path), "--limit", "4", "--out", str(out), *args], tmp_path)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and message in lines[0], err
    assert written(out) == []


def test_does_not_apply_to_taggers(tiny_attention_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(AttnAuditError, match="one per token"):
        run_test("sanity", tiny_attention_run("tagger"), out=tmp_path, limit=2)


def _python_with_quantus() -> str | None:
    """A Python that imports quantus: this one, else $QUANTUS_PYTHON or /tmp/venv-quantus (benchmarks/compare_quantus.py)."""
    import importlib.util
    import os
    import sys

    if importlib.util.find_spec("quantus") is not None:
        return sys.executable
    candidate = os.environ.get("QUANTUS_PYTHON", "/tmp/venv-quantus/bin/python")
    return candidate if Path(candidate).exists() else None


@pytest.mark.slow  # imports quantus and torch in a second Python (~10 s)
def test_measures_agree_with_quantus(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    python = _python_with_quantus()
    if python is None:
        pytest.skip("quantus is not installed (python3 -m venv /tmp/venv-quantus && /tmp/venv-quantus/bin/pip install quantus)")
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "quantus.json"
    proc = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "compare_quantus.py"), "--python", python, "--check", "--n", "20",
         "--repeats", "1", "--out", str(out)], capture_output=True, text=True, cwd=root,
    )
    if not out.exists() and "not installed" in proc.stderr:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert set(result["agreement"]) == {"spearman", "topk", "entropy", "emprt_rise"}
    assert all(row["max_abs_difference"] <= 1e-6 and row["instances"] > 0 for row in result["agreement"].values())


@pytest.mark.parametrize("name", ["han", "pair", "transformer-pair"])
def test_hierarchical_and_pair_models(name: str, tiny_attention_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run = tiny_attention_run(name)
    result = run_test("sanity", run, out=tmp_path, limit=4, plot=False, methods=["attention", "gradient"], **QUICK)
    assert result.summary["layers"] >= 4 and [b["order"] for b in result.tables["blocks"]] == list(range(1, result.summary["layers"] + 1))
    assert all(row["n"] > 0 for row in result.tables["layers"] if row["step"] > 0)
    assert result.tables["blocks"][-1]["block"].startswith("embedding")  # the embeddings are the bottom layer
    assert all("reset_parameters" in block["drawn_by"] for block in result.tables["blocks"])  # nn modules: their own reset


def test_tied_weights_are_randomised_with_either_module() -> None:
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.mid = torch.nn.Linear(4, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight  # tied, as in a decoder

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.mid(self.embed(x)))

    model = Tied()
    blocks, _ = layers_top_down(model, lambda: model(torch.tensor([[1, 2]])))
    assert [b.name for b in blocks] == ["head", "mid", "embed"]
    rand = Randomiser(model, blocks, seed=0)
    _step, block, params = next(rand.cascading(1))
    assert block.name == "head" and params == {"embed.weight"}  # the head's draw lands on the one shared tensor
    assert not torch.equal(rand.model.embed.weight, model.embed.weight) and rand.model.head.weight is rand.model.embed.weight
