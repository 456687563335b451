"""Progress bars for long work (rich), silenced globally by ``--quiet``."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Sized
from typing import TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

T = TypeVar("T")

console = Console(stderr=True)
_quiet = False


def set_quiet(quiet: bool) -> None:
    """Silence (or restore) every progress bar and status line."""
    global _quiet
    _quiet = quiet


def is_quiet() -> bool:
    """Whether progress bars and status lines are off (``--quiet``)."""
    return _quiet


def track(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """Iterate with a progress bar on stderr unless quiet; off a terminal there is no bar (a log would
    keep only a blank line where it was), so logs hold the status lines alone."""
    if _quiet or not sys.stderr.isatty():
        yield from items
        return
    if total is None and isinstance(items, Sized):
        total = len(items)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    ) as progress:
        task = progress.add_task(description, total=total)
        for item in items:
            yield item
            progress.advance(task)


def status(message: str) -> None:
    """One status line on stderr (unless quiet)."""
    if not _quiet:
        console.print(message, highlight=False)
