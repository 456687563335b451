"""Freed memory handed back to the operating system before a long pass.

glibc's ``malloc`` keeps what a pass freed: tensors under its mmap threshold (which rises, up to 32 MB, each time
a larger block is freed) come from the heap, and a freed heap block is reused only by allocations that fit in it.
Between the passes of one explanation at thousands of tokens (the decision and attention rows, then the gradient
pass) SmolLM2 left 170 MB of freed blocks resident at T = 1,024 that the next pass did not reuse, so the process's
peak held both (measured: benchmarks/results/long_context.json). ``malloc_trim(0)`` returns every free page to the
system; it costs a walk of the heap (milliseconds), so it runs only before passes over long sequences
(:data:`~attnaudit.models.hf.passes.CHECKPOINT_TOKENS` positions or more). Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS, Windows)."""
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None


def release_freed_memory() -> bool:
    """Return the C heap's free pages to the system (glibc); whether it could."""
    trim = _trim()
    if trim is None:
        return False
    trim(0)
    return True
