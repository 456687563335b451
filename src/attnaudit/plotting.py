"""Matplotlib as every figure of attnaudit uses it: the file backend, and text drawn literally."""

from __future__ import annotations

from types import ModuleType


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
