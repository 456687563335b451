"""Freed memory handed back to the operating system before a long pass and before each of its blocks.

glibc's ``malloc`` keeps what a pass frees: tensors under its mmap threshold (which rises, up to 32 MB, each time a
larger block is freed) come from the heap, and a heap's free pages stay resident while live tensors (a checkpointed
block's saved input, the next block's states) sit above them. Over thousands of tokens each block's transient
activations (SmolLM2's feed-forward states: 12 MB per 2,048 positions each) are freed after it, and the next block,
allocating in a different order, does not reuse all of them: the process's resident memory grew by several times
what autograd actually held (``benchmarks/bench_long_context.py`` measures the peaks end to end). ``malloc_trim(0)``
returns every free page to the system; it costs a walk of the heap (about a millisecond), so it runs only for
sequences of :data:`~attnaudit.models.hf.passes.CHECKPOINT_TOKENS` positions or more, whose blocks take seconds.
Elsewhere than glibc it does nothing.
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
