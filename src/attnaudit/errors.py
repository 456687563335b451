"""User-facing errors: one line, no traceback, exit code 2 (see ``cli.main``)."""

from __future__ import annotations

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


# Control characters quoted from a (binary) input file would garble the terminal: show them escaped.
_CONTROL = {code: f"\\x{code:02x}" for code in (*range(32), 127)}


class AttnAuditWarning(UserWarning):
    """Recoverable input problems (odd encoding, truncation); shown as one line by the CLI."""


def warn(message: str) -> None:
    """Emit a one-line :class:`AttnAuditWarning`."""
    import warnings

    warnings.warn(message, AttnAuditWarning, stacklevel=2)


def error_line(exc: BaseException) -> str:
    """One line for a logged failure: our errors' own message, others prefixed with their type."""
    lines = str(exc).strip().splitlines()
    message = lines[0] if lines else ""
    return message if isinstance(exc, AttnAuditError) else f"{type(exc).__name__}: {message}".rstrip(": ")
