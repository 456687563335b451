"""User-facing errors: one line, no traceback, exit code 2 (see ``cli.main``)."""

from __future__ import annotations

import errno
from collections.abc import Iterable
from pathlib import Path


class AttnAuditError(Exception):
    """An error caused by the user's input or arguments; printed as one line."""

    exit_code = 2


class InputError(AttnAuditError):
    """Malformed input data, located at ``path:line`` when the line is known."""

    def __init__(self, path: str | Path, message: str, line: int | None = None) -> None:
        self.path = str(path)
        self.line = line
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {message.translate(_CONTROL)}")


class FolderInUse(AttnAuditError):
    """An output folder held by another attnaudit process (:func:`~attnaudit.io.locked`)."""


# Control characters quoted from a (binary) input file would garble the terminal: show them escaped.
_CONTROL = {code: f"\\x{code:02x}" for code in (*range(32), 127)}


class AttnAuditWarning(UserWarning):
    """Recoverable input problems (odd encoding, truncation); shown as one line by the CLI."""


def spelled(name: str, known: Iterable[str]) -> str | None:
    """``name`` as ``known`` spells it, ``-`` and ``_`` taken alike and case ignored (``cp-lrp`` is ``cp_lrp``); None if none."""
    def key(text: str) -> str:
        return text.replace("-", "_").lower()

    return next((candidate for candidate in known if key(candidate) == key(name)), None)


def unknown(what: str, name: str, known: Iterable[str]) -> str:
    """``unknown test 'permutatoin'; did you mean 'permutation'? (choose from ...)``: an error's words."""
    import difflib

    choices = list(known)
    close = difflib.get_close_matches(name.replace("-", "_").lower(), [c.replace("-", "_").lower() for c in choices], n=1, cutoff=0.6)
    hint = next((f"; did you mean {c!r}?" for c in choices if close and c.replace("-", "_").lower() == close[0]), "")
    return f"unknown {what} {name!r}{hint} (choose from {', '.join(choices)})"


def named(what: str, name: str, known: Iterable[str]) -> str:
    """The registered spelling of ``name`` (:func:`spelled`), or a one-line error suggesting the closest (:func:`unknown`)."""
    found = spelled(name, known)
    if found is None:
        raise AttnAuditError(unknown(what, name, known))
    return found


def warn(message: str) -> None:
    """Emit a one-line :class:`AttnAuditWarning`."""
    import warnings

    warnings.warn(message, AttnAuditWarning, stacklevel=2)


def error_line(exc: BaseException) -> str:
    """One line for a logged failure: our errors' own message, others prefixed with their type."""
    lines = str(exc).strip().splitlines()
    message = lines[0] if lines else ""
    return message if isinstance(exc, AttnAuditError) else f"{type(exc).__name__}: {message}".rstrip(": ")


_OS_REASONS = {
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOENT: "not found",
    errno.EISDIR: "is a directory, expected a file",
    errno.ENOTDIR: "a part of the path is not a directory",
    errno.EROFS: "read-only file system",
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file too large for this file system",
    errno.ENAMETOOLONG: "file name too long",
}
STORAGE_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
"""Errors after which no further result can be stored: an audit stops instead of going on."""


def os_reason(exc: OSError) -> str:
    """What an I/O error means, in a few words."""
    return _OS_REASONS.get(exc.errno or 0) or (exc.strerror or str(exc) or type(exc).__name__)


def os_error_line(exc: OSError) -> str:
    """``PATH: reason`` for an I/O fault (permissions, a full disk, a read-only folder), as ``cli.main`` prints it."""
    path = exc.filename2 if exc.filename is None else exc.filename
    return f"{path}: {os_reason(exc)}" if path is not None else os_reason(exc)


def storage_full(exc: BaseException) -> OSError | None:
    """The full-disk (or quota) ``OSError`` behind ``exc`` (itself, its cause or context), else None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError) and current.errno in STORAGE_FULL:
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None
