"""Training: dev-based selection, idempotent re-runs, and resume after kill -9 gives identical results."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnaudit.errors import AttnAuditError
from attnaudit.run import load_run
from attnaudit.training.trainer import evaluate, train

TINY = {"embed_dim": 16, "hidden_dim": 8}

SCRIPT = """
import sys, torch
torch.set_num_threads(1)
from attnaudit.progress import set_quiet
from attnaudit.training.trainer import train
set_quiet(True)
train("synthetic", "bilstm", sys.argv[1], epochs=6, patience=10, embed_dim=16, hidden_dim=16, seed=3)
"""


def _metrics(path: Path) -> dict:
    data = json.loads((path / "metrics.json").read_text())
    data.pop("train_seconds")
    for row in data["history"]:
        row.pop("seconds", None)
    return data


def test_train_writes_run_and_reloads_identically(tmp_path: Path) -> None:
    run = train("synthetic", "bilstm", tmp_path / "run", epochs=2, seed=1, **TINY)
    for name in ("config.json", "model.safetensors", "vocab.json", "metrics.json"):
        assert (tmp_path / "run" / name).exists(), name
    assert not (tmp_path / "run" / "checkpoint").exists()
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["selection"] == "best dev accuracy"
    assert metrics["best_dev"] == max(h["dev"]["accuracy"] for h in metrics["history"])
    reloaded = load_run(tmp_path / "run")
    assert evaluate(reloaded, "test") == metrics["test"]
    again = train("synthetic", "bilstm", tmp_path / "run", epochs=2, seed=1, **TINY)  # idempotent: loads
    assert torch.equal(again.model.embedding.weight, reloaded.model.embedding.weight)
    assert run.task.labels == reloaded.task.labels


def test_same_seed_same_weights(tmp_path: Path) -> None:
    train("synthetic", "average", tmp_path / "a", epochs=1, seed=5, **TINY)
    train("synthetic", "average", tmp_path / "b", epochs=1, seed=5, **TINY)
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _metrics(tmp_path / "a") == _metrics(tmp_path / "b")


def test_bad_options_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(AttnAuditError, match="unknown model 'lstm'"):
        train("synthetic", "lstm", tmp_path / "x")
    with pytest.raises(AttnAuditError, match="unknown attention normaliser"):
        train("synthetic", "transformer", tmp_path / "x", attention="softmin")
    with pytest.raises(AttnAuditError, match="unknown training option"):
        train("synthetic", "bilstm", tmp_path / "x", colour="red")


def test_kill_during_training_then_resume_matches_uninterrupted(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "full")], check=True, env=env)
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path / "killed")], env=env)
    state = tmp_path / "killed" / ".partial" / "checkpoint" / "state.json"  # the run is built in .partial until whole
    deadline = time.time() + 120
    while time.time() < deadline and not (state.exists() and json.loads(state.read_text())["epoch"] >= 2):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "killed" / "metrics.json").exists(), "killed run must not look complete"
    assert not (tmp_path / "killed" / "config.json").exists(), "nor look like a run at all"
    subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "killed")], check=True, env=env)
    full = load_file(tmp_path / "full" / "model.safetensors")
    resumed = load_file(tmp_path / "killed" / "model.safetensors")
    assert all(torch.equal(full[k], resumed[k]) for k in full)
    assert _metrics(tmp_path / "full") == _metrics(tmp_path / "killed")


def test_lr_schedule_warms_up_then_decays() -> None:
    from attnaudit.training.loop import Optimiser

    def lr_factor(step: int, warmup: int, total: int) -> float:
        return Optimiser(schedule="linear", warmup=warmup).factor(step, total)

    assert lr_factor(5, 0, 100) == 1.0
    assert [lr_factor(s, 4, 12) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(8, 4, 12) == 0.5 and lr_factor(12, 4, 12) == 0.0


def test_word_dropout_replaces_only_real_words_and_is_seeded() -> None:
    from attnaudit.data.types import Batch
    from attnaudit.training.trainer import drop_words

    tokens = torch.tensor([[2, 5, 6, 7, 0, 0], [3, 8, 9, 1, 4, 0]])
    batch = Batch(tokens=tokens, mask=tokens != 0, query=torch.tensor([[5, 6, 0]]), query_mask=torch.tensor([[1, 1, 0]]).bool())
    assert torch.equal(drop_words(batch, 0.0, 1, 3, torch.Generator().manual_seed(0)).tokens, tokens)
    everything = drop_words(batch, 1.0, 1, 3, torch.Generator().manual_seed(0))
    # words (id >= 3) become <unk>; padding and the special id 2 stay; the query is dropped too
    assert everything.tokens.tolist() == [[2, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]]
    assert everything.query.tolist() == [[1, 1, 0]]
    big = Batch(tokens=torch.randint(3, 100, (64, 50)), mask=torch.ones(64, 50, dtype=torch.bool))
    first = drop_words(big, 0.3, 1, 3, torch.Generator().manual_seed(7)).tokens
    assert torch.equal(first, drop_words(big, 0.3, 1, 3, torch.Generator().manual_seed(7)).tokens)
    assert abs(float((first == 1).float().mean()) - 0.3) < 0.03


def test_word_dropout_trains_and_default_keeps_old_config_hash(tmp_path: Path) -> None:
    from attnaudit.training.trainer import _config_hash

    run = train("synthetic", "bilstm", tmp_path / "run", epochs=1, seed=1, word_dropout=0.2, **TINY)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["train"]["word_dropout"] == 0.2 and run.model is not None
    plain = {"model": {"a": 1}, "train": {"epochs": 2}}
    assert _config_hash({**plain, "train": {"epochs": 2, "word_dropout": 0.0}}) == _config_hash(plain)
    assert _config_hash({**plain, "train": {"epochs": 2, "word_dropout": 0.1}}) != _config_hash(plain)


def test_cli_train_passes_word_dropout_and_clip(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from attnaudit.cli import app

    out = tmp_path / "run"
    args = ["train", "--task", "synthetic", "--model", "average", "--out", str(out), "--epochs", "1",
            "--embed-dim", "8", "--hidden-dim", "8", "--word-dropout", "0.2", "--clip", "1.5", "--quiet"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    train_config = json.loads((out / "config.json").read_text())["train"]
    assert train_config["word_dropout"] == 0.2 and train_config["clip"] == 1.5


def test_relative_data_dir_is_recorded_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--data-dir ../shared/data` given from one folder: the run still finds its data from another."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from fake_data import make_fake_data

    from attnaudit.run import load_run

    make_fake_data(tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    train("sst", "bilstm", "run", data_dir="data", epochs=1, embed_dim=8, hidden_dim=8, quiet_eval=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    run = load_run(tmp_path / "run")
    assert run.task.data_dir == str(tmp_path / "data")
    assert len(run.examples("test")) == 16
