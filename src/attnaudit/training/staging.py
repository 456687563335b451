"""A run folder written as a unit: ``train``, ``finetune`` and ``train-nmt`` build the run in ``OUT/.partial`` and move
it into ``OUT`` only once it is whole (issue #47 item 4).

A full disk, a failure or a kill during training therefore leaves ``OUT`` as it was: empty, or the run it held
before (a retraining in place keeps the old run whole until the new one is finished). ``OUT/.partial`` keeps the
finished epochs' checkpoint, so the same command resumes from it; nothing reads it as a run (it is hidden in
``OUT``, and ``load_run`` on ``OUT`` names the unfinished training). The move itself renames files within one
folder (no data is written): the old run's ``config.json`` goes first, the new one comes last, so a kill
between two renames leaves a folder no command takes for a run, never a mix of two.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from attnaudit.errors import AttnAuditError, os_error_line
from attnaudit.io import LOCK, remove_stray_tmp
from attnaudit.run import CONFIG, STAGE

KEPT = frozenset({LOCK, STAGE})
"""What a retraining in place never removes from ``OUT``: the lock and the stage."""
RUN_FOLDERS = frozenset({"checkpoint", "epochs", "hf"})
"""The old run's own sub-folders (its epoch checkpoint, kept epochs, Hugging Face model), replaced with the new run; other folders
(a training-based test's ``subruns/``, ``results/``) are left in place."""


def stage_of(out: Path) -> Path:
    """Where the run for ``out`` is built."""
    return Path(out) / STAGE


@contextmanager
def staged(out: Path) -> Iterator[Path]:
    """The folder to build the run for ``out`` in; moved into ``out`` when the block ends normally (:func:`publish`).

    An I/O fault in the block (a full disk) is one line that says ``out`` is unchanged and where the finished
    epochs wait; any other failure or an interrupt leaves the stage for the same command to resume from."""
    out = Path(out)
    stage = stage_of(out)
    stage.mkdir(parents=True, exist_ok=True)
    remove_stray_tmp(stage, recursive=True)  # what a killed earlier training left half-written
    try:
        yield stage
    except OSError as exc:
        raise AttnAuditError(f"{os_error_line(exc)}; {out} is unchanged (the unfinished run waits in {stage}: the same "
                             "command resumes from its last finished epoch, deleting it frees the space)") from exc
    publish(stage, out)


def publish(stage: Path, out: Path) -> None:
    """Move the whole run in ``stage`` into ``out``, replacing the run ``out`` held: the old ``config.json`` first (from
    then on ``out`` is no run), the old run's other files and its checkpoint, then the new entries, ``config.json`` last.
    A folder that held no run (an empty one, an audit's) loses nothing."""
    if (out / CONFIG).is_file():
        (out / CONFIG).unlink()
        for entry in out.iterdir():
            if entry.name in KEPT or (entry.is_dir() and not entry.is_symlink() and entry.name not in RUN_FOLDERS):
                continue
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    for entry in sorted(stage.iterdir(), key=lambda path: path.name == CONFIG):
        target = out / entry.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(entry, target)
    stage.rmdir()
