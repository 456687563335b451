"""One place that seeds every random source, so the same seed gives the same numbers."""

from __future__ import annotations

import random

import numpy as np
import torch

from attnaudit.errors import AttnAuditError
from attnaudit.options import check_seed


def set_seed(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices); a seed outside 0..2^32-1 is refused, not wrapped."""
    check_seed(seed, "seed")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(device: str | None) -> torch.device:
    """``auto`` (or None) picks CUDA when present, else CPU; ``cpu``, ``cuda`` and ``cuda:N``
    are checked here so a bad ``--device`` fails before any work starts."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise AttnAuditError(f"--device must be auto, cpu, cuda or cuda:N, got {device!r}") from None
    if resolved.type not in ("cpu", "cuda"):
        raise AttnAuditError(f"--device must be auto, cpu, cuda or cuda:N, got {device!r}")
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise AttnAuditError(f"--device {device}: CUDA is not available here (torch {torch.__version__}); use cpu or auto")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise AttnAuditError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) present")
    return resolved
