"""Jain & Wallace's training protocol as options of ``train`` (``--preset jain-wallace``):
sentences wrapped in ``<s> … </s>`` that attention never weighs and no test treats as an item
(checked against a by-hand masked formulation and a by-hand leave-one-out), the length filter
and its counts, the preset's notes and overrides, each CLI option reaching the run's config,
and identical weights from the same seed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnaudit.data.synthetic import synthetic_task
from attnaudit.data.types import Example
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.runner import run_test
from attnaudit.explain.methods.gradient import gradient_importance
from attnaudit.explain.methods.loo import loo_importance
from attnaudit.models import ModelConfig, build_model
from attnaudit.progress import set_quiet
from attnaudit.run import load_run
from attnaudit.training.trainer import PRESETS, train
from tests.reliability.helpers import cli

set_quiet(True)
TINY = {"embed_dim": 6, "hidden_dim": 5, "batch_size": 16}


def _model(wrap: bool, seed: int = 0) -> torch.nn.Module:
    config = ModelConfig(model="bilstm", task_type="classification", vocab_size=12, num_labels=2, embed_dim=6,
                         hidden_dim=5, dropout=0.0, extra={"wrap": [2, 3]} if wrap else {})
    torch.manual_seed(seed)
    return build_model(config).eval()


def _batch(model: torch.nn.Module, rows: list[list[int]]) -> object:
    from attnaudit.data.types import Batch

    width = max(map(len, rows))
    tokens = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = True
    return Batch(tokens=tokens, mask=mask, examples=[Example([str(t) for t in row]) for row in rows])


def _by_hand(model: torch.nn.Module, row: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Jain & Wallace's formulation for one sentence: the LSTM reads ``<s> row </s>``; the additive
    scores of the two ends are set to -inf, so their softmax weights are exactly 0."""
    ids = torch.tensor([2, *row, 3])
    lstm = model.encoder.rnn
    states, _ = lstm(model.embedding(ids)[None])
    scorer = model.scorer
    scores = scorer.v(torch.tanh(scorer.key_proj(states[0]))).squeeze(-1)
    scores[0] = scores[-1] = float("-inf")
    weights = torch.softmax(scores, 0)
    logits = model.output(weights @ states[0])
    return weights, logits


def test_wrapped_model_matches_the_masked_formulation() -> None:
    model = _model(wrap=True)
    rows = [[4, 5, 6, 7, 8], [9, 10, 4], [11, 5, 6, 7, 8, 9, 10]]
    with torch.no_grad():
        out = model(_batch(model, rows))
        for i, row in enumerate(rows):
            weights, logits = _by_hand(model, row)
            assert weights[0] == 0 and weights[-1] == 0  # the ends are never attended to
            trace = out.trace[0].weights[i, 0, 0]
            assert torch.allclose(trace[: len(row)], weights[1:-1], atol=1e-6)
            assert torch.all(trace[len(row):] == 0) and math.isclose(float(trace.sum()), 1.0, rel_tol=1e-6)
            assert torch.allclose(out.logits[i], logits, atol=1e-5)
        plain = _model(wrap=False)
        plain.load_state_dict(model.state_dict())
        assert not torch.allclose(plain(_batch(plain, rows)).logits, out.logits, atol=1e-4)  # the ends matter


def test_the_ends_are_not_items_of_gradient_or_leave_one_out() -> None:
    model = _model(wrap=True, seed=1)
    rows = [[4, 5, 6, 7, 8], [9, 10, 4]]
    batch = _batch(model, rows)
    gradient = gradient_importance(model, batch)
    loo = loo_importance(model, batch)
    assert gradient.shape == loo.shape == batch.tokens.shape
    with torch.no_grad():
        for i, row in enumerate(rows):
            full = _by_hand(model, row)[1].softmax(-1)
            for j in range(len(row)):  # remove token j, re-wrap, rerun: |Δ p(predicted class)|
                shorter = _by_hand(model, row[:j] + row[j + 1 :])[1].softmax(-1)
                expected = abs(float(full[full.argmax()] - shorter[full.argmax()]))
                assert math.isclose(float(loo[i, j]), expected, rel_tol=1e-4, abs_tol=1e-6)


def _short_files(folder: Path) -> dict[str, list[list[str]]]:
    """Synthetic train/dev/test CSV files in which every third training and every fourth test
    sentence is cut under 6 tokens; returns each split's token lists."""
    data = synthetic_task("classification", seed=0, n_train=60, n_dev=20, n_test=20)
    cut = {"train": (3, 3), "dev": (5, 5), "test": (4, 2)}
    splits = {}
    for name, (every, length) in cut.items():
        rows = [(ex.tokens if i % every else ex.tokens[:length], ex.label) for i, ex in enumerate(data.split(name))]
        (folder / f"{name}.csv").write_text("text,label\n" + "".join(f"{' '.join(t)},{label}\n" for t, label in rows))
        splits[name] = [t for t, _ in rows]
    return splits


def test_preset_notes_overrides_length_filter_and_wrapped_importance(tmp_path: Path) -> None:
    splits = _short_files(tmp_path)
    expected = {s: sum(len(tokens) < 6 for tokens in rows) for s, rows in splits.items()}
    assert expected["train"] == 20 and expected["test"] == 5
    files = {s: f"csv:{tmp_path / s}.csv" for s in splits}
    run = train(files["train"], "bilstm", tmp_path / "jw", dev=files["dev"], test=files["test"], preset="jain-wallace",
                epochs=3, dropout=0.2, quiet_eval=True, **TINY)
    metrics = json.loads((tmp_path / "jw" / "metrics.json").read_text())
    config = json.loads((tmp_path / "jw" / "config.json").read_text())
    counts = ", ".join(f"{expected[s]} of {len(splits[s])} {s}" for s in ("train", "dev", "test"))
    assert f"min_length 6: removed examples with fewer than 6 tokens ({counts})" in metrics["notes"]
    preset = [n for n in metrics["notes"] if n.startswith("preset jain-wallace: ")]
    assert len(preset) == 1 and preset[0].endswith("; overridden: epochs=3, dropout=0.2")
    assert all(f"{k}={v}" in preset[0] for k, v in PRESETS["jain-wallace"].items())
    assert config["train"]["preset"] == "jain-wallace" and config["task"]["min_length"] == 6
    assert config["model"]["dropout"] == 0.2 and config["model"]["extra"]["wrap"] == [2, 3]
    training = metrics["training"]
    assert training["epochs_run"] == 3 and training["selected_epoch"] >= 2
    assert training["optimiser"]["name"] == "amsgrad" and training["optimiser"]["clip"] is None
    assert training["selection"]["metric"] == "dev.roc_auc" and training["selection"]["patience"] is None
    assert metrics["dev"]["n"] == len(splits["dev"]) - expected["dev"]
    assert metrics["test"]["n"] == len(splits["test"]) - expected["test"]
    # The reloaded run sees the filtered data, and the importance test ranks the real tokens only.
    loaded = load_run(tmp_path / "jw")
    test = loaded.examples("test")
    assert len(test) == len(splits["test"]) - expected["test"] and min(len(ex.tokens) for ex in test) >= 6
    result = run_test("importance", loaded, split="test")
    assert [r["length"] for r in result.instances] == [len(ex.tokens) for ex in test]
    assert loaded.collate.vocab.specials[2:] == ["<s>", "</s>"]
    assert run.model.wraps


def test_explicit_options_switch_preset_settings_off(tmp_path: Path) -> None:
    data = synthetic_task("classification", seed=0, n_train=40, n_dev=10, n_test=10)
    train(data, "bilstm", tmp_path / "off", preset="jain-wallace", epochs=2, wrap=False, min_length=0,
          early_stop=True, patience=1, select="dev-accuracy", clip=5.0, quiet_eval=True, **TINY)
    config = json.loads((tmp_path / "off" / "config.json").read_text())
    assert "wrap" not in config["model"]["extra"] and "min_length" not in config["task"]
    assert config["train"]["select"] == "accuracy" and config["train"]["clip"] == 5.0
    assert "early_stop" not in config["train"]  # back at its default: left out of the config
    tagging = synthetic_task("tagging", seed=0, n_train=20, n_dev=5, n_test=5)
    with pytest.raises(AttnAuditError, match="--wrap applies to classification tasks"):
        train(tagging, "bilstm", tmp_path / "t", wrap=True)
    with pytest.raises(AttnAuditError, match="--select dev-roc-auc needs a binary classification task"):
        train(tagging, "bilstm", tmp_path / "t", select="dev-roc-auc")
    assert not (tmp_path / "t" / "config.json").exists()


def test_same_seed_same_weights_and_every_epoch_kept(tmp_path: Path) -> None:
    data = synthetic_task("classification", seed=0, n_train=40, n_dev=10, n_test=10)
    for name in ("a", "b"):
        train(data, "bilstm", tmp_path / name, preset="jain-wallace", epochs=2, seed=3, keep_epochs=name == "a",
              quiet_eval=True, **TINY)
    a, b = (load_file(tmp_path / n / "model.safetensors") for n in ("a", "b"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    selected = json.loads((tmp_path / "a" / "metrics.json").read_text())["training"]["selected_epoch"]
    kept = load_file(tmp_path / "a" / "epochs" / f"epoch{selected}.safetensors")
    assert sorted(p.name for p in (tmp_path / "a" / "epochs").iterdir()) == ["epoch1.safetensors", "epoch2.safetensors"]
    assert all(torch.equal(kept[k], a[k]) for k in a)
    assert not (tmp_path / "b" / "epochs").exists()


def test_cli_options_reach_the_run_config(tmp_path: Path) -> None:
    out = tmp_path / "cli"
    proc = cli("train", "--task", "synthetic", "--model", "bilstm", "--out", out, "--embed-dim", "6", "--hidden-dim", "5",
               "--preset", "jain-wallace", "--epochs", "2", "--patience", "none", "--clip", "none", "--select", "dev-accuracy",
               "--min-epoch", "1", "--no-decay", "scorer.*,output.*", "--optimizer", "adamw", "--weight-decay", "0.01",
               "--dropout", "0.3", "--loss", "mean", "--no-wrap", "--min-length", "3", "--quiet")
    assert proc.returncode == 0, proc.stderr
    config = json.loads((out / "config.json").read_text())
    train_cfg = config["train"]
    assert train_cfg["early_stop"] is False and train_cfg["clip"] == 0.0 and train_cfg["select"] == "accuracy"
    assert train_cfg["no_decay"] == ["scorer.*", "output.*"] and train_cfg["optimizer"] == "adamw"
    assert train_cfg["weight_decay"] == 0.01 and "loss" not in train_cfg and "min_epoch" not in train_cfg
    assert config["model"]["dropout"] == 0.3 and "wrap" not in config["model"]["extra"]
    assert config["task"]["min_length"] == 3
    notes = json.loads((out / "metrics.json").read_text())["notes"]
    assert any(n.startswith("preset jain-wallace:") and "overridden: epochs=2" in n for n in notes)
