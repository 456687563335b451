"""Madsen et al. (2022)'s BiLSTM protocol as ``--preset madsen2022-sst`` / ``madsen2022-babi``: every setting
reaches the run's config and the loop (AMSGrad, no decay on the attention scorer, no clipping, every epoch
trained, the best dev ROC-AUC / accuracy epoch kept)."""

from __future__ import annotations

import json

import pytest
import torch

from attnaudit.data.synthetic import synthetic_task
from attnaudit.progress import set_quiet
from attnaudit.training.trainer import PRESETS, TrainConfig, train

set_quiet(True)


@pytest.mark.parametrize(
    ("preset", "select", "epochs", "batch"), [("madsen2022-sst", "roc_auc", 8, 32), ("madsen2022-babi", "accuracy", 100, 50)]
)
def test_madsen_presets_reach_the_config_and_the_loop(tmp_path, preset: str, select: str, epochs: int, batch: int) -> None:
    data = synthetic_task("classification", seed=0, n_train=60, n_dev=20, n_test=20)
    assert PRESETS[preset]["epochs"] == epochs and PRESETS[preset]["batch_size"] == batch
    run = train(data, "bilstm", tmp_path / "run", preset=preset, epochs=2, hidden_dim=8, embed_dim=8, quiet_eval=True)
    model, settings = run.info["model"], run.info["train"]
    assert model["hidden_dim"] == 8 and model["scorer"] == "tanh" and model["dropout"] == 0.0
    assert settings["optimizer"] == "amsgrad" and settings["lr"] == 1e-3 and settings["weight_decay"] == 1e-5
    assert settings["no_decay"] == ["scorer.*"] and settings["clip"] == 0.0 and settings["early_stop"] is False
    assert settings["select"] == select and settings["batch_size"] == batch and settings["preset"] == preset
    if preset == "madsen2022-babi":
        assert model["embed_dim"] == 8  # explicit options override the preset's 50
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["epochs"] == 2 and len(metrics["history"]) == 2  # every epoch trained
    kept = max(metrics["history"], key=lambda h: h["dev"][select])
    assert metrics["best_dev"] == pytest.approx(kept["dev"][select])
    loop = TrainConfig(**settings).loop("classification")
    groups = loop.optimiser.groups(run.model)
    exempt = {id(p) for p in groups[1]["params"]}
    assert exempt == {id(p) for n, p in run.model.named_parameters() if n.startswith("scorer.")}
    assert isinstance(loop.optimiser.build(run.model), torch.optim.Adam) and loop.optimiser.build(run.model).defaults["amsgrad"]
