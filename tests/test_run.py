"""``load_run`` hands a run directory to the loader registered for the kind its config records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from attnaudit.errors import AttnAuditError, InputError
from attnaudit.run import RUN_LOADERS, load_run, register_run_loader

TASK = {"spec": "synthetic", "task_type": "classification", "labels": ["neg", "pos"]}


def write_run(folder: Path, **config: Any) -> Path:
    """A run directory holding only ``config.json`` (``model``, ``task`` and ``config``)."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model": {}, "task": TASK, **config}))
    return folder


def toy_loader(path: Path, device: str | None = "auto", data_dir: str | Path | None = None) -> Any:
    """A loader that returns what it was asked for, so the test sees the call."""
    return ("toy", path, device, data_dir)


def test_load_run_calls_the_loader_registered_for_the_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("attnaudit.run.RUN_LOADERS", dict(RUN_LOADERS))
    register_run_loader("toy", toy_loader)
    run = write_run(tmp_path / "toy", kind="toy")
    assert load_run(run, device="cpu", data_dir="data") == ("toy", run, "cpu", "data")
    # a loader named by "module:function" is imported when a run of its kind is first loaded
    register_run_loader("named", f"{__name__}:toy_loader")
    named = write_run(tmp_path / "named", kind="named")
    assert load_run(str(named))[:2] == ("toy", named)
    # a config without "kind" is an attnaudit run (what `train` writes)
    register_run_loader("attnaudit", toy_loader)
    assert load_run(write_run(tmp_path / "plain"))[0] == "toy"


def test_unknown_kind_is_one_line_listing_the_registered_kinds(tmp_path: Path) -> None:
    run = write_run(tmp_path / "other", kind="other-program")
    with pytest.raises(InputError) as error:
        load_run(run)
    message = str(error.value)
    assert message == f"{run / 'config.json'}: unknown run kind 'other-program'; known kinds: attnaudit, hf, nmt"
    assert "\n" not in message


def test_a_loader_must_be_a_function_or_a_module_path() -> None:
    for kind, loader in (("", toy_loader), ("toy", "no_colon"), ("toy", 3)):
        with pytest.raises(AttnAuditError, match="a run loader needs"):
            register_run_loader(kind, loader)  # type: ignore[arg-type]
    assert "toy" not in RUN_LOADERS


def test_run_module_imports_no_model_family_nor_trainer() -> None:
    """Loading the Run type (as every experiment does) pulls in neither transformers nor a loader's module."""
    code = "import sys, attnaudit.run; print(' '.join(sorted(sys.modules)))"
    modules = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())
    assert "attnaudit.run" in modules
    loaded = {m for m in modules if m.startswith(("attnaudit.models.", "attnaudit.training", "transformers"))}
    assert loaded == {"attnaudit.models.interface"}, loaded  # the interface a Run holds, and nothing else
