"""Atomic writes: a result file either exists complete or not at all."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def digest(value: Any) -> str:
    """A short stable hash of a JSON-able value (sorted keys): how runs and sub-runs recognise their config."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def csv_cell(value: Any) -> Any:
    """A value for one CSV cell: containers as JSON text, scalars unchanged."""
    return json.dumps(value, default=str) if isinstance(value, (dict, list, tuple)) else value


def check_output_dir(path: str | Path) -> Path:
    """Fail before any work when ``path`` cannot become an output folder (it is a file)."""
    from attnaudit.errors import AttnAuditError

    path = Path(path)
    for parent in (path, *path.parents):
        if parent.exists():
            if not parent.is_dir():
                raise AttnAuditError(f"{parent}: exists and is not a directory; give an output folder")
            break
    return path


def file_mode() -> int:
    """The mode a newly created file gets under the current umask (``0o666 & ~umask``)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write(path: str | Path, writer: Callable[[Path], None]) -> Path:
    """Call ``writer(tmp_path)`` then rename the temporary file onto ``path``.

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


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    """Write ``obj`` as indented strict JSON, atomically."""
    return atomic_write_text(path, json.dumps(_clean(obj), indent=2, allow_nan=False) + "\n")


def read_json(path: str | Path) -> Any:
    """Read a JSON file, turning a decode error into an ``InputError`` with the line."""
    from attnaudit.errors import InputError

    path = Path(path)
    if not path.exists():
        raise InputError(path, "file not found")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
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
