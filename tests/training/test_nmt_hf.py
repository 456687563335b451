"""``train-nmt --arch marian|bart``: a Hugging Face encoder-decoder trained from scratch by the one loop."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnaudit.data.word_alignments import synthetic_translation
from attnaudit.io import read_json
from attnaudit.models.hf import HFModel
from attnaudit.run import load_run
from attnaudit.training.nmt import evaluate_nmt, train_nmt

SIZE = {"layers": 1, "heads": 2, "d_model": 16, "d_ff": 32, "source_vocab": 80, "max_len": 64, "max_train_len": 40,
        "batch_size": 16, "lr": 3e-3, "warmup": 5}


@pytest.mark.parametrize("arch", ["marian", "bart"])
def test_trains_saves_reloads_and_is_idempotent(arch: str, tmp_path: Path) -> None:
    """The selected epoch is an ``hf`` run directory whose reloaded model gives the returned run's dev loss
    (which metrics.json records); a second call with the same settings loads it instead of training."""
    data = synthetic_translation(seed=0, n_train=96, n_dev=16, n_test=8, lexicon_size=10)
    out = tmp_path / arch
    run = train_nmt(data, out, arch=arch, epochs=3, device="cpu", **SIZE)
    metrics = read_json(out / "metrics.json")
    assert isinstance(run.model, HFModel) and run.model.hf_type == arch
    assert metrics["training"]["steps"] == 18 and len(metrics["history"]) == 3
    selected = metrics["training"]["selected_epoch"]
    assert metrics["history"][selected - 1]["dev"]["loss"] == pytest.approx(metrics["dev"]["loss"], abs=1e-6)
    assert metrics["history"][-1]["train_loss"] < metrics["history"][0]["train_loss"]
    assert "dev_bleu" in metrics
    loaded = load_run(out, device="cpu")
    assert isinstance(loaded.model, HFModel) and loaded.task.task_type == "seq2seq"
    assert evaluate_nmt(loaded, data.dev)["loss"] == pytest.approx(metrics["dev"]["loss"], abs=1e-6)
    weights = out / "hf" / "model.safetensors"
    before = weights.stat().st_mtime_ns
    again = train_nmt(data, out, arch=arch, epochs=3, device="cpu", **SIZE)
    assert weights.stat().st_mtime_ns == before
    batch = again.collate(data.dev[:4])
    with torch.no_grad():
        assert torch.equal(again.model(batch).logits, loaded.model(batch).logits)


def test_unknown_arch_is_refused(tmp_path: Path) -> None:
    from attnaudit.errors import AttnAuditError

    with pytest.raises(AttnAuditError, match="choose one of nmt, marian, bart"):
        train_nmt(synthetic_translation(seed=0, n_train=20, n_dev=4, n_test=4), tmp_path / "x", arch="t5", device="cpu", **SIZE)
