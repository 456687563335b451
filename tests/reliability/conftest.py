"""A tiny trained run shared by the reliability tests (copied before any test damages it)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from attnaudit.progress import is_quiet, set_quiet
from attnaudit.run import Run
from attnaudit.training.trainer import train

from .documented import PRODUCERS, Workspace, documented_commands, tiny_environment
from .helpers import built_once, synthetic_rows, write_table


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """A tiny BiLSTM trained for one epoch on a 120-row synthetic CSV, with an explicit 20-row test file."""
    folder = tmp_path_factory.mktemp("trained")
    rows = synthetic_rows(140)
    write_table(folder / "train.csv", rows[:120])
    write_table(folder / "test.csv", rows[120:])
    previous = is_quiet()
    set_quiet(True)
    try:
        return train(
            f"csv:{folder / 'train.csv'}", "bilstm", folder / "run", test=f"csv:{folder / 'test.csv'}",
            epochs=1, embed_dim=8, hidden_dim=8, quiet_eval=True,
        )
    finally:
        set_quiet(previous)


@pytest.fixture
def run_copy(trained: Run, tmp_path: Path) -> Path:
    """A private copy of the trained run directory, free to corrupt."""
    assert trained.path is not None
    return Path(shutil.copytree(trained.path, tmp_path / "run"))


def _produce(folder: Path) -> None:
    """A workspace in ``folder/ws`` after the documentation's producing commands; failures in ``failures.json``."""
    workspace = Workspace(folder / "ws")
    for command in documented_commands():
        if command.verb in PRODUCERS:
            code, _, err = workspace.run(workspace.rewrite(command.args))
            if code != 0:
                workspace.producer_failures.append(f"{command}: exit {code}: {err.strip()[-500:]}")
    workspace.add_script_runs()
    (folder / "failures.json").write_text(json.dumps(workspace.producer_failures))


@pytest.fixture(scope="session")
def docs_workspace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workspace]:
    """The scratch checkout of tests/reliability/documented.py with every run the documentation's
    producing commands (train, finetune, train-nmt, in the order shown) write, on tiny data: built
    once per test run (:func:`built_once`), a private copy per worker.

    Failures of those commands are kept in ``workspace.producer_failures`` (tested apart), so one
    broken training example does not hide the rest.
    """
    monkeypatch = pytest.MonkeyPatch()
    for key, value in tiny_environment().items():
        monkeypatch.setenv(key, value)
    from attnaudit.data import synthetic

    monkeypatch.setattr(synthetic.synthetic_task, "__defaults__", (160, 40, 40))
    template = built_once(tmp_path_factory, "docs-template", _produce)
    root = tmp_path_factory.mktemp("docs")
    shutil.copytree(template / "ws", root, dirs_exist_ok=True)
    workspace = Workspace.existing(root)
    workspace.producer_failures = json.loads((template / "failures.json").read_text())
    yield workspace
    monkeypatch.undo()
