"""Figures drawn the same way by several tests: a measure against max attention, histograms, attention rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnaudit.plotting import save_figure


def plot_against_max_attention(
    frame: Any, value: str, xlabel: str, title: str, directory: Path, stem: str
) -> list[Path]:
    """``value`` against the instance's max attention, one panel per predicted class (J&W style).

    Instances are binned by max attention (tenths of [0, 1]); each bin is a horizontal box plot.
    """
    from attnaudit.plotting import pyplot

    plt = pyplot()

    frame = frame[np.isfinite(frame[value].astype(float))]
    classes = sorted(frame["predicted"].astype(str).unique()) or ["(none)"]
    fig, axes = plt.subplots(
        1, len(classes), figsize=(3.8 * len(classes), 3.6), sharey=True, squeeze=False, layout="constrained"
    )
    edges = np.linspace(0.0, 1.0, 11)
    labels = [f"{edges[b]:.1f}-{edges[b + 1]:.1f}" for b in range(10)]
    for ax, cls in zip(axes[0], classes):
        sub = frame[frame["predicted"].astype(str) == cls]
        bins = np.clip(np.digitize(sub["max_attention"].to_numpy(float), edges) - 1, 0, 9)
        values = sub[value].to_numpy(float)
        data = [(b, values[bins == b]) for b in range(10) if np.any(bins == b)]
        if data:
            ax.boxplot([d for _, d in data], positions=[b for b, _ in data], orientation="horizontal", widths=0.6)
        ax.set_yticks(range(10), labels)
        ax.set_ylim(-0.7, 9.7)
        ax.locator_params(axis="x", nbins=4)
        ax.set_xlabel(xlabel)
        ax.set_title(f"predicted {cls} (n={len(sub)})")
    axes[0][0].set_ylabel("max attention")
    fig.suptitle(title)
    return save_figure(fig, directory, stem)


def plot_histogram(values: Sequence[float], xlabel: str, title: str, directory: Path, stem: str, marker: float | None) -> list[Path]:
    """A histogram of the finite ``values``, with an optional vertical line at ``marker``."""
    from attnaudit.plotting import pyplot

    plt = pyplot()

    arr = np.asarray(values, dtype=float)
    arr = arr[np.isfinite(arr)]
    fig, ax = plt.subplots(figsize=(5, 3.4), layout="constrained")
    ax.hist(arr, bins=30, color="#4c72b0")
    if marker is not None:
        ax.axvline(marker, color="#c44e52", linestyle="--", label=f"{marker:g}")
        ax.legend()
    ax.set_xlabel(xlabel)
    ax.set_ylabel("instances")
    ax.set_title(f"{title} (n={arr.size})")
    return save_figure(fig, directory, stem)


def plot_attention_rows(rows: Sequence[Mapping[str, Any]], directory: Path, stem: str, title: str) -> list[Path]:
    """A grid of last-layer attention heatmaps (:func:`attention_rows`): one row per setting, one column per sentence."""
    from attnaudit.plotting import pyplot

    plt = pyplot()

    if not rows:
        return []
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    indices = sorted({int(r["index"]) for r in rows})
    by_key = {(r["setting"], int(r["index"])): r for r in rows}
    # One colour scale for the whole figure so that settings can be compared by eye.
    vmax = max(max(max(q) for q in r["weights"]) for r in rows) or 1.0
    fig, axes = plt.subplots(
        len(settings),
        len(indices),
        figsize=(3.0 * len(indices), 2.8 * len(settings)),
        squeeze=False,
        layout="constrained",
    )
    for r, setting in enumerate(settings):
        for c, index in enumerate(indices):
            ax = axes[r][c]
            row = by_key.get((setting, index))
            if row is None:
                ax.axis("off")
                continue
            image = ax.imshow(row["weights"], vmin=0.0, vmax=vmax, cmap="viridis")
            # Tick labels only under the bottom row (a column is one sentence): drawing
            # hundreds of tick labels dominates the plotting time.
            ax.set_yticks([])
            if r == len(settings) - 1:
                tokens = row["tokens"]
                ticks = list(range(0, len(tokens), max(1, -(-len(tokens) // 20))))
                ax.set_xticks(ticks, [tokens[t] for t in ticks], rotation=90, fontsize=6)
            else:
                ax.set_xticks([])
            if c == 0:
                ax.set_ylabel(setting, fontsize=9)
            if r == 0:
                ax.set_title(f"sentence {index}", fontsize=9)
    fig.colorbar(image, ax=axes, shrink=0.6)
    fig.suptitle(title + " (last layer, mean over heads; rows = queries, columns = keys)", fontsize=10)
    return save_figure(fig, directory, stem)
