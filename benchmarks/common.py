"""Shared bits of the benchmark and reproduction scripts: provenance and result files."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from attnaudit.io import atomic_write_json

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
RUNS = ROOT / "benchmarks" / "runs"


def commit() -> str:
    """The current commit (with ``-dirty`` when the tree has changes), or ``uncommitted``."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "uncommitted"


def provenance() -> dict[str, Any]:
    """Command line, commit, cores and platform, stored with every result."""
    return {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "commit": commit(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def write_result(name: str, payload: dict[str, Any]) -> Path:
    """Write ``benchmarks/results/<name>.json`` atomically with provenance."""
    return atomic_write_json(RESULTS / f"{name}.json", {"name": name, **payload, **provenance()})
