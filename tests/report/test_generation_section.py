"""The report's view of the ``generation`` test: each prompt's generated tokens shaded by each per-token measure
the test names (:meth:`Experiment.token_measures`), escaped, static (no script)."""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path

import pytest

from attnaudit.experiments.generation_steps import GenerationTests
from attnaudit.experiments.runner import run_test
from attnaudit.hf import load_hf
from attnaudit.progress import set_quiet
from attnaudit.report import build_report
from attnaudit.report.html import sequences_block

set_quiet(True)
HOSTILE = "</script><b>bold</b>"


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from attnaudit.architectures import save_tiny

    return save_tiny("llama", tmp_path_factory.mktemp("section") / "llama")


def test_a_generation_result_gets_a_view_of_each_prompt(llama: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "the film was very good"}) + "\n" + json.dumps({"prompt": "a bad film", "target": " good film"}) + "\n")
    out = tmp_path / "out"
    result = run_test("generation", load_hf(str(llama), device="cpu"), out=out, plot=False, prompts=str(prompts), generate=2,
                      permutations=2, adversaries=0, normalisers="sparsemax", methods="attention", resamples=10)
    result.instances[0]["token"] = HOSTILE  # a token the tiny model cannot make, put in the stored result
    result.save(out)
    measures = GenerationTests().token_measures(result)
    assert list(measures) == ["probability", "permutation_token_change", "erase_top_tvd", "erase_random_tvd", "sparsemax_tvd",
                              "comprehensiveness_attention", "sufficiency_attention"]
    page = build_report(out, explore=0).read_text()
    assert HOSTILE not in page and "<script" not in page.lower()
    section = page.split('<section id="test-generation">')[1].split("</section>")[0]
    assert 'data-index="0"' in section and 'data-index="1"' in section and html.escape(HOSTILE) in section
    for measure in measures:
        assert section.count(f'<tr data-measure="{measure}">') == 2  # one row per prompt
    first = section.split('<tr data-measure="probability">')[1].split("</tr>")[0]
    rows = [r for r in result.instances if r["index"] == 0]
    peak = max(r["probability"] for r in result.instances)
    assert [float(a) for a in re.findall(r"rgba\(230,97,1,([0-9.]+)\)", first)] == pytest.approx([r["probability"] / peak for r in rows], abs=1e-3)


def test_sequences_are_ordered_by_step_signed_and_missing_values_marked() -> None:
    rows = [{"index": 0, "step": 1, "token": "b", "m": -0.5}, {"index": 0, "step": 0, "token": "a", "m": 1.0},
            {"index": 1, "step": 0, "token": "c", "m": math.nan}]
    block = sequences_block(rows, {"m": "a measure"})
    first = block.split('data-index="0"')[1].split("</tr>")[0]
    assert re.findall(r'rgba\(([0-9,.]+)\)" title="step (\d)', first) == [("230,97,1,1.000", "0"), ("11,87,208,0.500", "1")]
    second = block.split('data-index="1"')[1]
    assert '<span class="tok na" title="step 0 &#x27;c&#x27;: m = n/a">c</span>' in second
    assert "(largest magnitude 1)" in block
