"""Cross-model studies: a sweep over Hugging Face models (the ``hf`` axis and its settings), sweep.csv's
model columns, and the study page (study.html) with its intervals and faithfulness rankings."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
import pytest

import attnaudit.sweep as sweep_module
from attnaudit.progress import set_quiet
from attnaudit.study import STUDY_HTML, interval, wilson
from attnaudit.sweep import load_config, plan, run_job, sweep

from .conftest import HF_TEXTS
from .reliability.helpers import assert_clean_failure, cli

set_quiet(True)


def test_hf_axes_make_one_job_per_model_and_setting(tmp_path: Path) -> None:
    path = tmp_path / "study.yaml"
    path.write_text(
        "grid:\n  tasks: [sst2]\n  hf: [minilm, smollm2]\n  prompts: [\"Review: {text}\\nSentiment:\", 'Text: {text} Mood:']\n"
        "  verbalizers: ['negative=\" bad\",positive=\" good\"']\n  dtypes: [bfloat16]\n  max_lengths: [64]\n"
        "  models: [bilstm]\n  seeds: [0, 1]\ntrain: {epochs: 1}\n",
        encoding="utf-8",
    )
    jobs = plan(load_config(path), tmp_path / "out")
    assert [j.id for j in jobs if j.params["seed"] == 0] == [
        "sst2_bilstm_softmax_s0", "sst2_minilm_p1_v1_bfloat16_len64_s0", "sst2_minilm_p2_v1_bfloat16_len64_s0",
        "sst2_smollm2_p1_v1_bfloat16_len64_s0", "sst2_smollm2_p2_v1_bfloat16_len64_s0",
    ]
    assert len(jobs) == 10 and len({j.digest() for j in jobs}) == 10
    hf_job = next(j for j in jobs if j.id == "sst2_minilm_p1_v1_bfloat16_len64_s0")
    assert hf_job.params == {"task": "sst2", "hf": "minilm", "prompt": "Review: {text}\nSentiment:",
                             "verbalizer": {"negative": " bad", "positive": " good"}, "dtype": "bfloat16", "max_length": 64, "seed": 0}
    assert hf_job.train == {} and jobs[0].train == {"epochs": 1}  # training options go to the trained family only
    assert sweep_module._model_kwargs(hf_job) == {"hf": "minilm", "prompt": "Review: {text}\nSentiment:",
                                                  "verbalizer": {"negative": " bad", "positive": " good"},
                                                  "dtype": "bfloat16", "max_length": 64}


def test_chat_axes(tmp_path: Path) -> None:
    """``chats`` and ``systems``: a job per setting, named by it, and handed to the audit as --chat/--system."""
    path = tmp_path / "study.yaml"
    path.write_text("grid:\n  tasks: [sst2]\n  hf: [smollm2]\n  chats: [false, true]\n  systems: ['Answer in one word.']\n", encoding="utf-8")
    jobs = plan(load_config(path), tmp_path / "out")
    assert [j.id for j in jobs] == ["sst2_smollm2_sys1_s0", "sst2_smollm2_chat_sys1_s0"]
    assert sweep_module._model_kwargs(jobs[1]) == {"hf": "smollm2", "system": "Answer in one word.", "chat": True}
    path.write_text("grid:\n  tasks: [sst2]\n  hf: [smollm2]\n  chats: [maybe]\n", encoding="utf-8")
    with pytest.raises(Exception, match="grid.chats: expected true or false"):
        load_config(path)


def test_a_model_may_carry_its_own_settings(tmp_path: Path) -> None:
    """A prompted decoder beside an encoder (a grid-wide prompt would fail the encoder's job)."""
    path = tmp_path / "study.yaml"
    path.write_text(
        "grid:\n  tasks: [sst2]\n  hf:\n    - minilm\n"
        "    - {name: smollm2, prompt: \"Review: {text}\\nSentiment:\", verbalizer: {negative: ' bad', positive: ' good'}}\n"
        "  dtypes: [float32, bfloat16]\n",
        encoding="utf-8",
    )
    jobs = plan(load_config(path), tmp_path / "out")
    assert [j.id for j in jobs] == ["sst2_minilm_float32_s0", "sst2_minilm_bfloat16_s0", "sst2_smollm2_float32_s0",
                                    "sst2_smollm2_bfloat16_s0"]
    assert jobs[0].params == {"task": "sst2", "hf": "minilm", "dtype": "float32", "seed": 0}
    assert jobs[3].params == {"task": "sst2", "hf": "smollm2", "prompt": "Review: {text}\nSentiment:",
                              "verbalizer": {"negative": " bad", "positive": " good"}, "dtype": "bfloat16", "seed": 0}


def test_intervals_reported_bootstrapped_wilson_or_none() -> None:
    result = {"summary": {"x_ci": [0.1, 0.3]}, "instances": [{"tau": v} for v in (0.0, 1.0, 0.5, 0.5)], "meta": {"n": 4}}
    assert interval("x", 0.2, result) == (0.1, 0.3, "reported by the test")
    low, high, how = interval("tau_mean", 0.5, result) or (math.nan, math.nan, "")
    assert how == "bootstrap over instances" and 0.0 <= low < 0.5 < high <= 1.0
    assert interval("tau_mean", 0.7, result) is None  # not the mean of the instances' column: no interval is made up
    assert interval("fraction_insensitive", 0.5, {"meta": {"n": 8}}) == (*wilson(0.5, 8), "Wilson interval")
    assert wilson(0.5, 8) == pytest.approx((0.2152, 0.7848), abs=1e-4)  # 4 of 8, the textbook value
    assert interval("median_change_median", 0.001, {"meta": {"n": 8}}) is None
    assert interval("flip_attention_median_fraction", 0.4, {"meta": {"n": 8}}) is None  # a median, not a share of instances
    assert interval("accuracy", 0.5, None) is None


def test_study_of_three_models_with_one_failing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_hf) -> None:
    """A tiny BERT classifier, a tiny Llama classifying zero-shot and a folder that is no model: two audits,
    one failed job with its one-line error, sweep.csv's model columns and a self-contained study page."""
    from attnaudit.architectures import save_tiny

    save_tiny("llama", tmp_path / "llama")
    (tmp_path / "broken").mkdir()
    labels = {"neg": "negative", "pos": "positive"}
    pd.DataFrame({"text": [t for t, _ in HF_TEXTS], "label": [labels[y] for _, y in HF_TEXTS]}).to_csv(tmp_path / "tiny.csv", index=False)
    (tmp_path / "study.yaml").write_text(
        f"grid:\n  tasks: [csv:tiny.csv]\n  hf: [{tiny_hf.dir}, llama, broken]\n"
        "audit:\n  only: [importance, permutation, faithfulness]\n  split: train\n  limit: 5\n"
        "  set:\n    faithfulness: {methods: [attention, gradient, random]}\n    importance: {methods: [gradient]}\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sweep_module, "_run_local", lambda jobs, workers: (run_job(job) for job in jobs))  # in this process
    result = sweep(tmp_path / "study.yaml", out=tmp_path / "out")
    assert [job["status"] for job in result.jobs] == ["done", "done", "failed"]
    assert "\n" not in result.failed[0]["error"] and result.failed[0]["error"]

    table = pd.read_csv(result.csv)
    assert list(table.columns[:4]) == ["job", "task", "hf", "architecture"]
    assert table["architecture"].fillna("").tolist() == ["bert", "llama", ""]
    assert table["importance.tau_attention_vs_gradient_mean"].notna().tolist() == [True, True, False]

    page = (tmp_path / "out" / STUDY_HTML).read_text(encoding="utf-8")
    assert result.study == tmp_path / "out" / STUDY_HTML
    assert "default-src &#x27;none&#x27;" in page and "<script" not in page and not re.search(r"(src|href)=\"?https?:", page)
    assert ">llama<" in page and "(bert)" in page and "failed" in page and "5 of 6" in page
    assert page.count("AOPC comprehensiveness (delete") == 1 and "<b>attention</b>" in page
    assert len(re.findall(r"<th>rank \d of 3; (beats|does not clearly beat) random", page)) >= 2  # per model and mode
    tau = re.search(r"tau_attention_vs_gradient_mean</td>(.*?)</tr>", page)
    assert tau and tau.group(1).count("[") == 2 and "bootstrap over instances" in tau.group(1)

    again = sweep(tmp_path / "study.yaml", out=tmp_path / "out")  # the finished audits are not redone
    assert sorted(again.skipped) == sorted(job["id"] for job in result.jobs[:2])


def test_a_bad_study_file_is_one_line_naming_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "study.yaml"
    path.write_text("grid:\n  tasks: [sst2]\n  hf:\n    - minilm\n    - {name: smollm2, dtype: float16}\n", encoding="utf-8")
    out = tmp_path / "out"
    line = assert_clean_failure(cli("sweep", path, "--out", out, "--quiet"), str(path), 5, out)
    assert "grid.dtypes" in line and "float16" in line and not out.exists()
