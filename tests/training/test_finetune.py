"""Fine-tuning a (tiny, locally built) Hugging Face encoder into a run directory every test accepts."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import BertModel

from attnaudit.cli import app
from attnaudit.errors import AttnAuditError
from attnaudit.experiments import run_test
from attnaudit.run import load_run
from attnaudit.training.finetune import finetune


@pytest.fixture(scope="module")
def headless_dir(tiny_hf: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bare tiny BERT (no classification head), like the embedded MiniLM."""
    torch.manual_seed(1)
    path = tmp_path_factory.mktemp("bare-bert")
    BertModel(tiny_hf.config()).save_pretrained(path, safe_serialization=True)
    tiny_hf.tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tuned(tiny_hf: SimpleNamespace, headless_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tuned") / "run"
    finetune(tiny_hf.task(), out, hf=str(headless_dir), epochs=8, lr=3e-3, batch_size=2, seed=0, device="cpu")
    return out


def test_run_directory_layout_and_metrics(tuned: Path) -> None:
    config = json.loads((tuned / "config.json").read_text())
    assert config["kind"] == "hf" and config["task"]["labels"] == ["neg", "pos"]
    assert config["model"]["extra"]["trained_head"] is True
    metrics = json.loads((tuned / "metrics.json").read_text())
    assert metrics["selection"] == "best dev accuracy"
    training = metrics["training"]  # every epoch, or up to the first perfect dev accuracy (nothing later can be kept)
    ends = {"epochs": 8, "ceiling": training["selected_epoch"]}[training["stopped"]]
    assert len(metrics["history"]) == training["epochs_run"] == ends
    assert (metrics["best_dev"] == 1.0) == (training["stopped"] == "ceiling")
    assert metrics["best_dev"] == max(h["dev"]["accuracy"] for h in metrics["history"]) > 0.5  # it learned
    assert metrics["dev"]["accuracy"] == pytest.approx(metrics["best_dev"])  # the best epoch was kept
    suffixes = {p.suffix for p in tuned.rglob("*") if p.is_file()}
    assert ".safetensors" in suffixes and not suffixes & {".bin", ".pt", ".pkl", ".pth"}


def test_best_epoch_reloads_with_the_same_predictions(tuned: Path, tiny_hf: SimpleNamespace) -> None:
    run = load_run(tuned, device="cpu")
    assert run.family == "hf" and run.model.has_head and run.model.trained_head
    from attnaudit.training.trainer import evaluate_examples

    scores = evaluate_examples(run, tiny_hf.task().dev)
    metrics = json.loads((tuned / "metrics.json").read_text())
    assert scores["accuracy"] == pytest.approx(metrics["dev"]["accuracy"])


def test_finished_run_is_loaded_not_retrained(tuned: Path, tiny_hf: SimpleNamespace, headless_dir: Path) -> None:
    before = (tuned / "hf" / "model.safetensors").stat().st_mtime_ns
    finetune(tiny_hf.task(), tuned, hf=str(headless_dir), epochs=8, lr=3e-3, batch_size=2, seed=0, device="cpu")
    assert (tuned / "hf" / "model.safetensors").stat().st_mtime_ns == before


def test_post_hoc_tests_accept_the_run(tuned: Path, tiny_hf: SimpleNamespace) -> None:
    run = load_run(tuned, device="cpu")
    run._data = tiny_hf.task()  # the in-memory task (a named task would reload from --data-dir)
    result = run_test("norms", run, split="dev", out=tuned / "results", plot=False)
    assert result.summary["spearman_alpha_fx"] == result.summary["spearman_alpha_fx"]  # not NaN


def test_limit_samples_training_examples_and_validates(tiny_hf: SimpleNamespace, headless_dir: Path, tmp_path: Path) -> None:
    finetune(tiny_hf.task(), tmp_path / "r", hf=str(headless_dir), epochs=1, batch_size=2, limit=3, device="cpu")
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["finetune"]["train_examples"] == 3
    with pytest.raises(AttnAuditError, match="limit"):
        finetune(tiny_hf.task(), tmp_path / "x", hf=str(headless_dir), limit=0)
    with pytest.raises(AttnAuditError, match="epochs"):
        finetune(tiny_hf.task(), tmp_path / "x", hf=str(headless_dir), epochs=0)


def test_cli_command_is_registered() -> None:
    names = {command.name or command.callback.__name__ for command in app.registered_commands}
    assert "finetune" in names
