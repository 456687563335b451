"""A run folder is written as a unit (issue #47 item 4): a full disk during ``train``, ``finetune`` or ``train-nmt``
leaves no half run, never half-overwrites the run a folder held, and ``evaluate`` cannot take what is left for a run.

The full disk is simulated where the weights are written (``OSError(ENOSPC)``, as safetensors reports it): before this
``train`` left ``config.json`` and ``vocab.json`` without weights and ``evaluate`` said "checkpoint not found".
"""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from attnaudit.architectures import save_tiny
from attnaudit.training import staging

from .helpers import TINY_TRAIN, assert_clean_failure, cli, synthetic_rows, write_table


def _full_disk(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, after: int = 0) -> None:
    """``module.name`` raises ENOSPC once it has been called ``after`` times (the writes before it succeed)."""
    real, calls = getattr(module, name), []

    def full(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) > after:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(args[1] if len(args) > 1 else args[0]))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, full)


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and staging.STAGE not in p.parts}


def _csv(tmp_path: Path) -> Path:
    return write_table(tmp_path / "train.csv", synthetic_rows(60))


def _refused_as_unfinished(out: Path) -> None:
    proc = cli("evaluate", out, "--quiet")
    line = assert_clean_failure(proc, str(out))
    assert "its training did not finish" in line and "checkpoint not found" not in line


def test_a_full_disk_during_train_leaves_no_half_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import attnaudit.weights as weights

    out = tmp_path / "out"
    _full_disk(monkeypatch, weights, "save_file")  # config.json and vocab.json are written, then the weights fail
    proc = cli("train", "--task", f"csv:{_csv(tmp_path)}", "--out", out, *TINY_TRAIN)
    line = assert_clean_failure(proc, str(out / staging.STAGE), out=None)
    assert "no space left on device" in line and f"{out} is unchanged" in line
    assert [p.name for p in out.iterdir()] == [staging.STAGE]  # nothing of the run in out itself
    _refused_as_unfinished(out)
    monkeypatch.undo()
    assert cli("train", "--task", f"csv:{_csv(tmp_path)}", "--out", out, *TINY_TRAIN).returncode == 0  # the same command
    assert not (out / staging.STAGE).exists() and cli("evaluate", out, "--quiet").returncode == 0


def test_a_full_disk_while_retraining_keeps_the_old_run_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Training another config into a finished run's folder (no test results: allowed, in place): the old run stays
    byte for byte until the new one is whole, and stays usable."""
    import attnaudit.weights as weights

    out, data = tmp_path / "out", _csv(tmp_path)
    assert cli("train", "--task", f"csv:{data}", "--out", out, *TINY_TRAIN).returncode == 0
    before = _tree(out)
    _full_disk(monkeypatch, weights, "save_file", after=1)  # the first epoch's weights are saved, then the disk is full
    proc = cli("train", "--task", f"csv:{data}", "--out", out, *TINY_TRAIN[:2], "--epochs", "3", *TINY_TRAIN[4:])
    assert_clean_failure(proc, str(out / staging.STAGE))
    assert _tree(out) == before and cli("evaluate", out, "--quiet").returncode == 0
    monkeypatch.undo()
    assert cli("train", "--task", f"csv:{data}", "--out", out, *TINY_TRAIN[:2], "--epochs", "3", *TINY_TRAIN[4:]).returncode == 0
    assert _tree(out) != before and '"epochs": 3' in (out / "config.json").read_text()
    assert sorted(p.name for p in out.iterdir()) == sorted(before)  # the new run replaced the old one's files


def test_a_full_disk_during_finetune_leaves_no_half_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import attnaudit.hf as hf

    bert, out = save_tiny("bert", tmp_path / "bert"), tmp_path / "out"
    _full_disk(monkeypatch, hf, "save_hf_run")
    proc = cli("finetune", "--hf", bert, "--task", f"csv:{_csv(tmp_path)}", "--out", out, "--limit", "8", "--epochs", "1", "--quiet")
    line = assert_clean_failure(proc, str(out / staging.STAGE))
    assert "no space left on device" in line and [p.name for p in out.iterdir()] == [staging.STAGE]
    _refused_as_unfinished(out)


def test_a_full_disk_during_train_nmt_leaves_no_half_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import attnaudit.weights as weights

    out = tmp_path / "out"
    _full_disk(monkeypatch, weights, "save_file")
    proc = cli("train-nmt", "--task", "synthetic-translation", "--out", out, "--epochs", "1", "--max-steps", "2", "--layers", "1",
               "--heads", "1", "--d-model", "8", "--d-ff", "8", "--quiet")
    line = assert_clean_failure(proc, str(out / staging.STAGE))
    assert "no space left on device" in line and [p.name for p in out.iterdir()] == [staging.STAGE]
    _refused_as_unfinished(out)


def test_a_kill_while_the_run_moves_in_leaves_no_mix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The move renames the new run's files in, ``config.json`` last, after the old ``config.json`` is gone: stopped
    between two renames, the folder is no run (refused as unfinished), never the old config with new weights."""
    out, data = tmp_path / "out", _csv(tmp_path)
    assert cli("train", "--task", f"csv:{data}", "--out", out, *TINY_TRAIN).returncode == 0
    real, moved = os.replace, []

    def killed(source: Any, target: Any) -> None:
        if Path(target).parent == out:  # the move into out (os.replace is also every atomic write's last step)
            if len(moved) == 1:
                raise KeyboardInterrupt  # as a kill would stop it, after the first file moved in
            moved.append(source)
        real(source, target)

    monkeypatch.setattr(staging.os, "replace", killed)
    proc = cli("train", "--task", f"csv:{data}", "--out", out, *TINY_TRAIN[:2], "--epochs", "2", *TINY_TRAIN[4:])
    assert proc.returncode == 130 and moved and not (out / "config.json").exists()
    _refused_as_unfinished(out)


def test_a_folder_with_an_unfinished_training_is_ours_to_resume(tmp_path: Path) -> None:
    """An audit (or sweep job) folder whose run was interrupted in training holds ``run/.partial`` only, and a train
    folder only ``.partial``: the same command may write there again (a Ray sweep's resume once refused both jobs'
    folders as "not an attnaudit run or audit folder")."""
    from attnaudit.io import check_output_dir

    for folder in (tmp_path / "audit" / "run" / staging.STAGE / "checkpoint", tmp_path / "train" / staging.STAGE):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
    (tmp_path / "audit" / ".attnaudit.lock").write_text("123")
    assert check_output_dir(tmp_path / "audit") == tmp_path / "audit"
    assert check_output_dir(tmp_path / "train") == tmp_path / "train"
