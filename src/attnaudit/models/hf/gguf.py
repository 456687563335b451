"""GGUF models converted once into a plain safetensors folder, kept in a cache.

transformers de-quantises a GGUF file on every ``from_pretrained`` (the embedded SmolLM2-135M:
~15 s on 2 CPU cores, most of a short ``attnaudit explain`` or ``attnaudit tests`` command).
The first load saves the de-quantised float32 weights, the config and the tokenizer as an
ordinary Hugging Face folder under :func:`cache_root`; later loads, in any process, read that
folder instead (about a second). The folder's name holds a key of the file's resolved path, size
and modification time and of the transformers version, so a changed file or library converts
anew. Conversion runs under a file lock (two processes convert once) into a temporary folder
that is renamed into place, so a killed conversion leaves nothing half-written. When the cache
cannot be written (read-only home, full disk) the GGUF file is loaded directly, as before.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock


def cache_root() -> Path:
    """``$ATTNAUDIT_CACHE``, else ``$XDG_CACHE_HOME/attnaudit``, else ``~/.cache/attnaudit``."""
    if os.environ.get("ATTNAUDIT_CACHE"):
        return Path(os.environ["ATTNAUDIT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "attnaudit"


def cache_folder(gguf: Path) -> Path:
    """Where the conversion of ``gguf`` lives (whether or not it exists yet)."""
    import transformers

    resolved = gguf.resolve()
    stat = resolved.stat()
    key = f"{resolved}\0{stat.st_size}\0{stat.st_mtime_ns}\0{transformers.__version__}"
    return cache_root() / "gguf" / f"{resolved.stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def converted(gguf: Path, convert: Callable[[Path], None]) -> Path | None:
    """The cached folder of ``gguf``, made by ``convert(folder)`` on first use; None when the
    cache cannot be written. Errors of ``convert`` itself (a file that is not a GGUF model)
    propagate unchanged."""
    target = cache_folder(gguf)
    if (target / "config.json").is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(target) + ".lock")
        lock.acquire()
    except OSError:
        return None
    try:
        if (target / "config.json").is_file():  # another process converted it meanwhile
            return target
        scratch = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
        try:
            convert(scratch)
            scratch.rename(target)
        except OSError:
            return None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return target
    finally:
        lock.release()
