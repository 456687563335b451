"""Atomic writes, checked reads and locked output folders.

A result file either exists complete or not at all; an input is read only from a regular
file, within a size bound; an output folder is checked before any work and held by one
attnaudit process at a time.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, TypeVar, cast

from filelock import FileLock, Timeout

from attnaudit.errors import AttnAuditError, FolderInUse, InputError, os_reason

LOCK = ".attnaudit.lock"
MAX_READ_BYTES = 1 << 30
"""The largest file read whole (JSON, YAML, a parallel corpus); results of big audits run to tens of MB."""
_HELD: set[Path] = set()
RESULT_NAMES: set[str] = set()
"""The tests registered in this process (each adds its name as it registers; the CLI registers
them all): ``NAME.json`` in a folder is a result that attnaudit wrote."""
F = TypeVar("F", bound=Callable[..., Any])


def digest(value: Any) -> str:
    """A short stable hash of a JSON-able value (sorted keys): how runs and sub-runs recognise their config."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def csv_cell(value: Any) -> Any:
    """A value for one CSV cell: containers as JSON text, scalars unchanged."""
    return json.dumps(value, default=str) if isinstance(value, (dict, list, tuple)) else value


def check_output_dir(path: str | Path) -> Path:
    """Fail before any work when ``path`` cannot become an output folder: it is a file or lies
    under one, it cannot be written, or it is a non-empty folder attnaudit did not write
    (``--out /`` must not fill the root folder, nor ``--out ~`` the home folder)."""
    path = Path(path)
    for parent in (path, *path.parents):
        if parent.exists():
            if not parent.is_dir():
                raise AttnAuditError(f"{parent}: exists and is not a directory; give an output folder")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise AttnAuditError(f"{path}: cannot write here: {parent} is read-only or not writable by this user")
            break
    if not path.is_dir():
        return path
    config = path / "config.json"
    if config.is_file():  # a run, or another program's folder: its config says which
        if not _is_run_config(read_json_object(config)):
            raise InputError(config, "not an attnaudit run config (no 'model' and 'task'); give a new or empty folder")
    elif not is_attnaudit_dir(path):
        raise AttnAuditError(f"{path}: not empty and not an attnaudit run or audit folder; give a new or empty folder")
    return path


def refuse_inside(out: str | Path, folder: str | Path | None, what: str = "the run folder", allowed: str | None = None) -> None:
    """A one-line error when the output folder ``out`` is ``folder`` or lies inside it: the run (or model)
    folder a command reads is only read (an ``--out`` there once mixed results into the run), but for its
    subfolder ``allowed`` (a run's own ``results``, where a test writes without ``--out``)."""
    if folder is None or not Path(folder).is_dir():
        return
    inside, read = Path(out).resolve(), Path(folder).resolve()
    if (inside == read or read in inside.parents) and not (allowed and inside == read / allowed):
        raise AttnAuditError(f"--out {out}: inside {what} {folder}, which is only read; give a folder outside it")


def file_mode() -> int:
    """The mode a newly created file gets under the current umask (``0o666 & ~umask``)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def is_attnaudit_dir(path: Path) -> bool:
    """Whether folder ``path`` holds what an attnaudit command writes: a run (a ``config.json``
    with ``model`` and ``task``), an audit, demo, sweep job or explanation (``audit.json``,
    ``demo.json``, ``job.json``, ``explanation.json``, or a ``results/``, ``run/``,
    ``checkpoint/``, ``subruns/`` or ``runs/`` of ours), the result JSONs of ``attnaudit run
    --out``, a leftover temporary file, or nothing but the lock. Names alone are not enough: ``/`` has a ``run/`` folder."""
    if _is_run(path) or _holds_ours(path):
        return True
    names = {p.name for p in path.iterdir()}
    if names & {"audit.json", "demo.json", "job.json", "explanation.json"}:
        return True
    if "results" in names and (path / "results").is_dir() and _holds_ours(path / "results"):
        return True
    if "run" in names and (_is_run(path / "run") or (path / "run" / ".partial").is_dir()):
        return True  # an audit's run, finished or still being trained (attnaudit.run.STAGE)
    if "checkpoint" in names and (path / "checkpoint" / "state.json").is_file():
        return True  # a training's epoch checkpoint
    if ".partial" in names and (path / ".partial").is_dir():
        return True  # an unfinished training's stage (attnaudit.run.STAGE)
    if "subruns" in names and (path / "subruns").is_dir() and _holds_subruns(path / "subruns"):
        return True
    return "runs" in names and (path / "runs").is_dir() and any(_is_run(p) for p in (path / "runs").iterdir())


def _holds_subruns(path: Path) -> bool:
    """Whether a ``subruns/`` folder holds a sub-run of ours at any depth (``roar`` nests them as
    ``roar/seed-0/gradient/ratio-10``), finished (a run config) or killed during its first one (an epoch
    checkpoint, ``checkpoint/state.json``): a test killed before its first result must resume."""
    return any(_is_run(p.parent) for p in path.rglob("config.json")) or any(path.rglob("checkpoint/state.json"))


def _holds_ours(path: Path) -> bool:
    """Whether folder ``path`` is empty but for our lock, or holds a leftover temporary file
    (``.NAME...tmp``, as :func:`atomic_write` and ``save_hf_run`` name theirs) or a result JSON
    of a registered test (or the heatmaps beside them)."""
    names = {p.name for p in path.iterdir()} - {LOCK}
    if not names or any(name.startswith(".") and name.endswith(".tmp") for name in names) or "heatmaps.json" in names:
        return True
    return any(f"{test}.json" in names for test in RESULT_NAMES)


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` is a folder holding an attnaudit run (a readable config with ``model`` and ``task``)."""
    return path.is_dir() and _is_run(path)


def _is_run(path: Path) -> bool:
    """Whether ``path`` holds a readable attnaudit run config (a JSON object with ``model`` and ``task``)."""
    if not (path / "config.json").is_file():
        return False
    try:
        return _is_run_config(read_json(path / "config.json"))
    except AttnAuditError:
        return False  # another program's config, or a damaged one: not ours to overwrite


def _is_run_config(config: Any) -> bool:
    """Whether a parsed ``config.json`` is an attnaudit run's (``load_run`` needs ``model`` and ``task``)."""
    return isinstance(config, dict) and "model" in config and "task" in config


@contextmanager
def locked(directory: str | Path) -> Iterator[Path]:
    """Hold ``directory``'s lock file for the block: a second attnaudit process writing the same
    folder fails at once with one line naming the holder's pid.

    Folders inside one this process already holds need no lock of their own (an audit writes
    its run, results and report). The lock file goes with the lock, and a folder created here and
    left empty is removed again, so a command that fails early leaves nothing behind.
    """
    directory = Path(directory)
    absolute = directory.resolve()
    if any(held == absolute or held in absolute.parents for held in _HELD):
        yield directory
        return
    created = not directory.exists()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AttnAuditError(f"{directory}: cannot create the output folder ({exc.strerror or exc})") from None
    lock = FileLock(directory / LOCK, blocking=False, on_acquired=_write_pid)
    try:
        try:
            lock.acquire()
        except Timeout:
            raise FolderInUse(f"{directory} is in use by another attnaudit process (pid {_holder(directory / LOCK)})") from None
        _HELD.add(absolute)
        try:
            yield directory
        finally:
            _HELD.discard(absolute)
            # Removed while still held, so no lock file outlives the command; a process that opens the path
            # after this gets a new file (and the lock), as it would a moment later anyway.
            (directory / LOCK).unlink(missing_ok=True)
            lock.release()
    finally:
        if created and directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()


def _write_pid(fd: int) -> None:
    """Record this process in the lock file it holds (best effort: a full disk must not stop the lock)."""
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass


def _holder(lock_file: Path) -> str:
    """The pid written into a held lock file, or ``unknown``."""
    try:
        text = lock_file.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"


def writes_folder(parameter: str, existing: bool = False) -> Callable[[F], F]:
    """Decorate a command function that writes the folder passed as argument ``parameter``:
    the folder is checked (:func:`check_output_dir`) and held (:func:`locked`) for the whole call.

    ``existing``: the command reads the folder it writes (``report``), so a missing one is
    left to the command to report rather than created.
    """

    def decorate(function: F) -> F:
        signature = inspect.signature(function)

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            folder = Path(bound.arguments[parameter])
            if existing and not folder.is_dir():
                return function(*args, **kwargs)
            with locked(check_output_dir(folder)):
                return function(*args, **kwargs)

        return cast(F, wrapper)

    return decorate


def atomic_write(path: str | Path, writer: Callable[[Path], object]) -> Path:
    """Call ``writer(tmp_path)`` (its return value is ignored) then rename the temporary file onto ``path``.

    The rename is atomic on POSIX, so a reader never sees a half-written file and a
    killed process leaves only a stray ``.tmp`` file behind, never a truncated result.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        writer(tmp_path)
        # after the writer: mkstemp creates 0600, and a writer may replace the file with its own
        # (safetensors' save_file writes a 0600 temporary file and renames it onto ``tmp``)
        os.chmod(tmp_path, file_mode())
        os.replace(tmp_path, path)
    except OSError as exc:  # name the file the user knows, not the temporary one
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
    finally:
        if tmp_path.exists():
            tmp_path.unlink()
    return path


# The name ``atomic_write`` gives its temporary file: ``.<name>.<8 random chars>.tmp`` (mkstemp).
_STRAY_TMP = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")


def remove_stray_tmp(directory: str | Path, recursive: bool = False) -> list[Path]:
    """Delete the temporary files a killed :func:`atomic_write` left in ``directory`` (and below
    when ``recursive``); only files named like ours, only in folders attnaudit writes."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    candidates = directory.rglob(".*.tmp") if recursive else directory.glob(".*.tmp")
    stray = [p for p in candidates if _STRAY_TMP.fullmatch(p.name) and p.is_file() and not p.is_symlink()]
    for path in stray:
        path.unlink(missing_ok=True)
    return stray


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (UTF-8)."""
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def _clean(obj: Any) -> Any:
    """Make ``obj`` strict-JSON: NaN/inf become None, numpy/torch scalars become floats."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):
        return _clean(obj.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def atomic_write_json(path: str | Path, obj: Any, indent: int | None = 2) -> Path:
    """Write ``obj`` as strict JSON (indented by ``indent``; None: one line, for large files), atomically."""
    return atomic_write_text(path, json.dumps(_clean(obj), indent=indent, allow_nan=False) + "\n")


def open_input(path: str | Path) -> IO[bytes]:
    """Open an input file for binary reading: a regular file, else one-line :class:`InputError`.

    A FIFO, a device such as ``/dev/zero`` or a socket is refused without blocking or reading
    from it (the file is opened non-blocking and checked before any read); a directory, a
    missing or unreadable file get their own messages.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise InputError(path, os_reason(exc)) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "is a directory, expected a file" if stat.S_ISDIR(mode) else "not a regular file (a FIFO, device or socket)"
        raise InputError(path, kind)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_input(path: str | Path, limit: int = MAX_READ_BYTES) -> bytes:
    """The bytes of a regular input file of at most ``limit`` bytes (see :func:`open_input`)."""
    with open_input(path) as handle:
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise InputError(path, os_reason(exc)) from None
    if len(data) > limit:
        raise InputError(path, f"larger than {limit >> 20} MiB, the most attnaudit reads from such a file")
    return data


def read_json(path: str | Path) -> Any:
    """Read a JSON file, turning a decode error into an ``InputError`` with the line."""
    path = Path(path)
    if not path.exists():
        raise InputError(path, "file not found")
    try:
        return json.loads(read_input(path).decode("utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(path, f"invalid JSON: {exc.msg}", exc.lineno) from None
    except UnicodeDecodeError:
        raise InputError(path, "not a UTF-8 JSON file") from None


JsonKinds = type | tuple[type, ...]
_JSON_NAMES = {dict: "an object", list: "an array", str: "a string", int: "an integer", float: "a number", bool: "true or false", type(None): "null"}


def _json_name(kinds: JsonKinds) -> str:
    return " or ".join(_JSON_NAMES.get(k, k.__name__) for k in (kinds if isinstance(kinds, tuple) else (kinds,)))


def _is_kind(value: Any, kinds: JsonKinds) -> bool:
    """JSON's view of ``isinstance``: true/false is no integer, an integer is a number."""
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    if isinstance(value, bool):
        return bool in kinds
    return isinstance(value, kinds) or (isinstance(value, int) and float in kinds)


def check_fields(
    path: str | Path,
    obj: Any,
    required: dict[str, JsonKinds] | None = None,
    optional: dict[str, JsonKinds] | None = None,
    where: str = "",
) -> dict[str, Any]:
    """``obj`` when it is a JSON object with the ``required`` fields and both kinds of fields of
    the given types; otherwise an ``InputError`` naming ``path`` (``where``: the object's own
    field name inside the file). Callers index what they check, so a file of the wrong shape
    (an array, a string for an object) is one line, not a traceback."""
    from attnaudit.errors import InputError

    if not isinstance(obj, dict):
        what = f"field {where!r} must be an object" if where else "expected a JSON object"
        raise InputError(path, f"{what}, found {_json_name(type(obj))}")
    for key, kinds in {**(optional or {}), **(required or {})}.items():
        name = f"{where}.{key}" if where else key
        if key not in obj:
            if required and key in required:
                raise InputError(path, f"missing field {name!r}")
        elif not _is_kind(obj[key], kinds):
            raise InputError(path, f"field {name!r} must be {_json_name(kinds)}, found {_json_name(type(obj[key]))}")
    return obj


def read_json_object(
    path: str | Path, required: dict[str, JsonKinds] | None = None, optional: dict[str, JsonKinds] | None = None
) -> dict[str, Any]:
    """:func:`read_json` of a file that must hold an object with fields of the given types (:func:`check_fields`)."""
    return check_fields(path, read_json(path), required, optional)
