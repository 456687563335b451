"""The report's explorer data: quantisation bound, escaping, attention and scores against the model
itself, per-instance test effects, size accounting, CSP, ``--explore`` and :func:`attnaudit.show`."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import attnaudit
from attnaudit.cli import app
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.experiment import Result
from attnaudit.explain import get_explanation, item_mask
from attnaudit.html_page import script_json
from attnaudit.report import build_report
from attnaudit.report.explorer import (
    dequantise,
    faithfulness_scores,
    instance_rows,
    pack,
    quantise,
    unpack,
)
from attnaudit.report.heatmaps import IG_STEPS
from attnaudit.run import Run
from tests.report.conftest import HOSTILE


@settings(max_examples=60, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(1, 3), st.integers(1, 6), st.integers(1, 6)),
              elements=st.floats(0, 1, allow_nan=False, width=32)))
def test_quantised_weights_are_within_half_a_step_of_the_layer_maximum(weights: np.ndarray) -> None:
    codes, scale = quantise(weights)
    assert codes.dtype == np.uint8 and codes.shape == weights.shape
    assert scale == pytest.approx(weights.max())
    assert np.abs(dequantise(codes, scale) - weights).max() <= weights.max() / 510 + 1e-12
    assert np.array_equal(unpack(pack([codes, codes[:1]])), np.concatenate([codes.ravel(), codes[:1].ravel()]))


def test_all_zero_weights_quantise_to_zero_with_scale_zero() -> None:
    codes, scale = quantise(np.zeros((2, 3)))
    assert scale == 0.0 and not codes.any()


@given(st.lists(st.text(), max_size=5))
def test_script_json_cannot_close_its_script_and_reads_back(texts: list[str]) -> None:
    data = {"tokens": [*texts, *HOSTILE, "</SCRIPT >", "<!--", "]]>&amp;"]}
    text = script_json(data)
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == data


def test_faithfulness_columns_go_to_the_longest_matching_method() -> None:
    row = {"attention_delete_aopc_comp": 0.1, "attention_delete_aopc_suff": 0.2, "attention_rollout_delete_aopc_comp": 0.3,
           "gradient_delete_comp@1": 0.9, "p_pred": 0.5}
    found = faithfulness_scores(row, ["attention", "attention_rollout", "gradient"])
    assert found == {"attention": {"mode": "delete", "comp": 0.1, "suff": 0.2},
                     "attention_rollout": {"mode": "delete", "comp": 0.3}}


def test_test_effects_keep_one_row_per_shown_instance_and_skip_per_layer_rows() -> None:
    results = {
        "permutation": Result("permutation", {}, [{"index": i, "median_change": i / 10, "source": "s"} for i in range(4)]),
        "identifiability": Result("identifiability", {}, [{"index": 0, "layer": 0}, {"index": 0, "layer": 1}]),
        "probe": Result("probe", {}, []),
    }
    tests, rows = instance_rows(results, {1, 3, 7})
    assert [t["name"] for t in tests] == ["permutation"]
    assert tests[0]["effects"][0]["column"] == "median_change" and tests[0]["effects"][0]["order"] == "desc"
    assert rows == {1: {"permutation": {"median_change": 0.1}}, 3: {"permutation": {"median_change": 0.3}}}


# --------------------------------------------------------------------------- a tiny audit (tests/report/conftest.py)


def embedded(page: str) -> dict:
    block = re.search(r'<script type="application/json" id="explorer-data">(.*?)</script>', page, re.S)
    assert block is not None
    return json.loads(block.group(1))


def test_report_embeds_the_shown_instances_with_the_models_own_attention(audited: tuple[Run, Path]) -> None:
    run, out = audited
    data = embedded((out / "report.html").read_text())
    assert [i["index"] for i in data["instances"]] == [0, 1, 2, 3]  # --explore 4 of the 6 tested
    examples = run.examples("test", 6)
    for instance in data["instances"]:
        batch = next(iter(run.batches([examples[instance["index"]]], 1)))  # alone: no padding
        with torch.no_grad():
            trace = run.model(batch).trace
        codes, offset = unpack(instance["attention"]), 0
        assert len(instance["layers"]) == len(trace) == 2
        for layer, record in zip(instance["layers"], trace.layers):
            reference = record.weights[0].numpy()
            size = reference.size
            decoded = dequantise(codes[offset: offset + size].reshape(reference.shape), layer["scale"])
            offset += size
            assert np.abs(decoded - reference).max() <= reference.max() / 510 + 1e-6
        assert offset == codes.size
        assert instance["tokens"] == list(examples[instance["index"]].tokens)
        for name, scores in instance["scores"].items():  # every method, recomputed on its own
            reference = get_explanation(name)(run, batch, steps=IG_STEPS)[0][item_mask(run, batch)[0]].double().numpy()
            assert np.allclose(scores, reference, rtol=2e-3, atol=2e-3 * np.abs(reference).max() + 1e-9), name
    assert {"attention", "gradient"} <= set(data["instances"][0]["scores"])
    assert [m["name"] for m in data["methods"]] == list(data["instances"][0]["scores"])


def test_each_instance_carries_what_the_tests_did_to_it(audited: tuple[Run, Path]) -> None:
    _, out = audited
    data = embedded((out / "report.html").read_text())
    permutation = {r["index"]: r for r in Result.load(out / "results" / "permutation.json").instances}
    erasure = {r["index"]: r for r in Result.load(out / "results" / "erasure.json").instances}
    for instance in data["instances"]:
        index = instance["index"]
        assert instance["tests"]["permutation"]["median_change"] == pytest.approx(permutation[index]["median_change"], rel=1e-3)
        assert instance["tests"]["erasure"]["removed_attention"] == erasure[index]["removed_attention"]
        assert instance["correct"] == (instance["gold"] == instance["pred"])
    best = {b["index"]: b for b in Result.load(out / "results" / "adversarial.json").tables["best_adversary"]}
    assert best
    for instance in data["instances"]:
        drawn = instance["distributions"].get("adversarial")
        if instance["index"] not in best:
            assert drawn is None
            continue
        for name in ("original", "adversary"):  # over the instance's tokens, to 4 significant digits
            assert len(drawn[name]) == len(instance["tokens"])
            assert drawn[name] == pytest.approx(best[instance["index"]][name], rel=1e-3, abs=1e-6)
    names = {t["name"]: t for t in data["tests"]}
    assert {"permutation", "erasure", "importance", "adversarial"} <= set(names)
    assert "median_change" in [e["column"] for e in names["permutation"]["effects"]]


def test_the_page_states_its_own_size_and_forbids_the_network(audited: tuple[Run, Path]) -> None:
    _, out = audited
    path = out / "report.html"
    page = path.read_text()
    stated = re.search(r"report size: ([0-9.]+) MB", page)
    assert stated and float(stated.group(1)) == pytest.approx(path.stat().st_size / 1e6, abs=0.005)
    block = re.search(r'(<script type="application/json" id="explorer-data">)(.*?)</script>', page, re.S)
    explorer = re.search(r"explorer data: ([0-9.]+) MB", page)
    assert explorer and float(explorer.group(1)) == pytest.approx(len(block.group(2).encode()) / 1e6, abs=0.005)
    csp = html.unescape(re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1))
    assert "default-src 'none'" in csp and "connect-src 'none'" in csp and "unsafe-eval" not in csp
    scripts = re.findall(r"<script>(.*?)</script>", page, re.S)
    assert len(scripts) == 1
    digest = base64.b64encode(hashlib.sha256(scripts[0].encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in csp
    assert "</" not in scripts[0] and "<script" not in scripts[0].lower()  # cannot end its own element
    assert "innerHTML" not in scripts[0] and "insertAdjacentHTML" not in scripts[0] and "eval(" not in scripts[0]
    assert not re.search(r"(src|href)=\"(https?:)?//", page)
    for token in HOSTILE:  # never raw in the page: escaped in the heatmaps, \u003c-escaped in the data
        assert token not in page


def test_explore_zero_and_a_smaller_explore_rebuild_without_the_model(audited: tuple[Run, Path], tmp_path: Path) -> None:
    from typer.testing import CliRunner

    out = tmp_path / "audit"  # a copy: the other tests read the audit's own report
    shutil.copytree(audited[1], out)
    build_report(out, explore=0)
    page = (out / "report.html").read_text()
    assert 'id="explorer-data"' not in page and "<script>" not in page
    done = CliRunner().invoke(app, ["report", str(out), "--explore", "2", "--quiet"])
    assert done.exit_code == 0, done.output
    assert [i["index"] for i in embedded((out / "report.html").read_text())["instances"]] == [0, 1]
    assert json.loads((out / "results" / "explorer.json").read_text())["requested"] == 4  # cut from the stored 4, not recomputed
    record = json.loads((out / "audit.json").read_text())
    (out / "audit.json").write_text(json.dumps({**record, "run": str(tmp_path / "gone")}))
    build_report(out, explore=10)  # more than stored and no run to compute them: the stored ones, said so
    data = embedded((out / "report.html").read_text())
    assert len(data["instances"]) == 4 and "the 4 stored instances shown, not 10" in data["notes"][-1]
    with pytest.raises(AttnAuditError, match="--explore must be >= 0"):
        build_report(out, explore=-1)


def test_show_returns_the_same_views_for_jupyter(audited: tuple[Run, Path]) -> None:
    run, out = audited
    shown = attnaudit.show(out, instance=2, explore=4)
    assert shown.payload["initial"] == 2 and len(shown.payload["instances"]) == 4
    frame = shown._repr_html_()
    assert frame.startswith('<iframe srcdoc="') and 'sandbox="allow-scripts"' in frame
    inner = html.unescape(re.search(r'srcdoc="([^"]*)"', frame).group(1))
    assert embedded(inner)["instances"] == embedded((out / "report.html").read_text())["instances"]
    assert "<script>" in inner and "Content-Security-Policy" in inner
    from_run = attnaudit.show(run, explore=3, limit=6)
    assert [i["index"] for i in from_run.payload["instances"]] == [0, 1, 2] and from_run.payload["tests"] == []
    before = sorted(p.name for p in run.path.iterdir())
    attnaudit.show(run.path, explore=2, limit=6)
    assert sorted(p.name for p in run.path.iterdir()) == before  # show() writes nothing
    with pytest.raises(AttnAuditError, match="instance 5 is not among the 4 explored"):
        attnaudit.show(out, instance=5, explore=4)


def test_a_decoder_llm_is_explored_causally_over_its_prompt(tiny_hf, tmp_path: Path) -> None:
    """Zero-shot tiny Llama: every layer causal (no weight above the diagonal), the prompt's tokens on
    both axes, the explanations over the text span only."""
    from attnaudit.hf import load_hf
    from attnaudit.report.explorer import model_data
    from tests.models.test_hf_decoder import save_llama_lm

    folder = save_llama_lm(tmp_path / "llama", tiny_hf.vocab, seed=1)
    run = load_hf(folder, task=tiny_hf.task(), device="cpu", prompt="the {text} was", verbalizer={"neg": "bad", "pos": "good"})
    examples = run.data().test[:3]
    data = model_data(run, examples, 3)
    assert data["causal"] and len(data["instances"]) == 3
    for instance, example in zip(data["instances"], examples):
        assert instance["tokens"] == ["the", *example.tokens, "was"] and instance["items"] == list(example.tokens)
        codes, offset = unpack(instance["attention"]), 0
        for layer in instance["layers"]:
            assert layer["causal"] and layer["kind"] == "self" and layer["q"] == layer["k"] == len(instance["tokens"])
            size = layer["heads"] * layer["q"] * layer["k"]
            weights = codes[offset: offset + size].reshape(layer["heads"], layer["q"], layer["k"])
            offset += size
            assert not np.triu(weights, 1).any() and weights[:, 0, 0].min() == 255  # the first token sees only itself
        assert set(instance["scores"]) == {m["name"] for m in data["methods"]} and "gradient" in instance["scores"]


@pytest.mark.parametrize("name", ["bilstm", "han", "pair", "transformer-pair", "tagger"])
def test_every_family_gives_distributions_over_its_real_keys(tiny_attention_run, name: str) -> None:
    """Each embedded layer: one decoded row per real query summing to 1 over the real keys (softmax),
    within the 8-bit bound; explanations only where the model makes one decision per instance."""
    from attnaudit.report.explorer import model_data

    run = tiny_attention_run(name)
    data = model_data(run, run.examples("test", 3), 3)
    assert len(data["instances"]) == 3
    for instance in data["instances"]:
        codes, offset = unpack(instance["attention"]), 0
        assert instance["layers"]
        for layer in instance["layers"]:
            size = layer["heads"] * layer["q"] * layer["k"]
            weights = dequantise(codes[offset: offset + size], layer["scale"]).reshape(layer["heads"], layer["q"], layer["k"])
            offset += size
            assert np.allclose(weights.sum(-1), 1.0, atol=layer["k"] * layer["scale"] / 510 + 1e-6)
        assert offset == codes.size
        assert bool(instance["scores"]) == (run.task.task_type != "tagging")
