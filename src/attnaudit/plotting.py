"""Matplotlib as every figure of attnaudit uses it: the file backend, and text drawn literally."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from attnaudit.io import atomic_write


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` with the Agg backend and mathtext off (set once, process-wide).

    Titles, tick labels and legends show users' labels and tokens; with mathtext on, a token
    such as ``$\\frac{$`` is parsed as TeX and makes the figure fail, and ``$x_1$`` renders as
    something it is not. attnaudit's own figure text uses no mathtext.
    """
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["text.parse_math"] = False
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, directory: Path, stem: str) -> list[Path]:
    """Save a matplotlib figure as PNG and SVG (atomically) and close it."""
    plt = pyplot()
    paths = []
    for ext in ("png", "svg"):
        path = Path(directory) / f"{stem}.{ext}"

        def write(tmp: Path, ext: str = ext) -> None:
            fig.savefig(tmp, format=ext, dpi=130, bbox_inches="tight")

        atomic_write(path, write)
        paths.append(path)
    plt.close(fig)
    return paths
