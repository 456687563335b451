"""Weight files: safetensors only, never pickle.

Tensors are only ever read with safetensors, so loading an untrusted file cannot execute
code: a file that looks like a pickle (``torch.save`` output) is refused, and so is a weight
that would load silently wrong (:func:`checked_weight`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from attnaudit.errors import InputError
from attnaudit.io import atomic_write, open_input

_PICKLE_MAGIC = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05", b"PK\x03\x04")
_MAX_HEADER = 100_000_000  # safetensors' own bound on the JSON header


def save_tensors(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> Path:
    """Atomically write tensors (made contiguous, CPU) as safetensors."""
    clean = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}

    def write(tmp: Path) -> None:
        try:
            save_file(clean, str(tmp), metadata=metadata)
        except SafetensorError as exc:  # a full disk arrives as "I/O error: ... (os error 28)": keep it an OSError
            code = re.search(r"os error (\d+)", str(exc))
            if code is None:
                raise
            raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(tmp)) from None

    return atomic_write(path, write)


def _sniff(path: Path) -> str:
    """``"safetensors"`` when ``path`` parses as one (an 8-byte little-endian header length, at
    most the rest of the file, then that many bytes of JSON object), else ``"pickle"`` when it
    starts with pickle/zip magic, else ``"unknown"``.

    Parsing first matters: a header of 1152 bytes starts the file with ``\\x80\\x04``, which is
    also pickle protocol 4's magic.
    """
    with open_input(path) as fh:  # a regular, readable file (not a folder, FIFO or device)
        size = os.fstat(fh.fileno()).st_size
        prefix = fh.read(8)
        length = int.from_bytes(prefix, "little") if len(prefix) == 8 else 0
        if 0 < length <= min(size - 8, _MAX_HEADER):
            try:
                if isinstance(json.loads(fh.read(length)), dict):
                    return "safetensors"
            except ValueError:  # not JSON, or not text
                pass
    return "pickle" if prefix.startswith(_PICKLE_MAGIC) else "unknown"


def load_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a safetensors file; refuse pickles and report corruption as one line."""
    path = _refuse_pickle(path)
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise _corrupt(path, exc) from None


def check_safetensors(path: str | Path) -> None:
    """Refuse, before any loader reads it, a weights file that is a pickle in disguise or whose header or data are
    cut or malformed (a one-line :class:`InputError`); the tensors are not read (the header and sizes are)."""
    path = _refuse_pickle(path)
    try:
        with safe_open(str(path), framework="pt") as fh:
            fh.keys()
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise _corrupt(path, exc) from None


def _refuse_pickle(path: str | Path) -> Path:
    """``path``, refused (one line) when missing, unreadable or a pickle."""
    path = Path(path)
    if not path.exists():
        raise InputError(path, "checkpoint not found")
    try:
        kind = _sniff(path)
    except OSError as exc:
        raise InputError(path, f"cannot read the checkpoint ({exc.strerror or exc})") from None
    if kind == "pickle":
        raise InputError(path, "looks like a pickle/torch.save file; attnaudit only loads safetensors and never unpickles")
    return path


def _corrupt(path: Path, exc: BaseException) -> InputError:
    return InputError(path, f"corrupt or truncated safetensors file ({str(exc).splitlines()[0][:120]})")


def checked_weight(path: Path, key: str, value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Weight ``key`` of ``path`` cast to the model's ``dtype`` (so float16/bfloat16 checkpoints load).

    Refused: integer/bool values for a floating parameter (a cast would load them silently as
    whole numbers), and NaN/Inf, which would make every score computed with the model NaN.
    """
    stored = str(value.dtype).removeprefix("torch.")
    wanted = str(dtype).removeprefix("torch.")
    if value.dtype != dtype and not (value.is_floating_point() and dtype.is_floating_point):
        raise InputError(path, f"weight {key} is stored as {stored}; the model needs {wanted}")
    value = value.to(dtype)
    if dtype.is_floating_point and not bool(torch.isfinite(value).all()):
        cast = "" if stored == wanted else f" (cast from {stored} to {wanted})"
        raise InputError(path, f"weight {key} holds NaN or Inf values{cast}")
    return value
