"""Figures for the eval suites (matplotlib, Agg backend: no display needed on workers)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def niah_heatmap(grid: dict[tuple[int, float], float | None], path: Path, *, title: str = "NIAH") -> Path:
    """The usual NIAH figure: context length on x, needle depth (0 % top) on y, accuracy colour
    from red (0) to green (1); cells not attempted are grey and marked "n/a"."""
    plt = _pyplot()
    lengths = sorted({L for L, _ in grid})
    depths = sorted({d for _, d in grid})
    acc_DL = np.full((len(depths), len(lengths)), np.nan)
    for (L, d), acc in grid.items():
        if acc is not None:
            acc_DL[depths.index(d), lengths.index(L)] = acc
    cmap = plt.get_cmap("RdYlGn").with_extremes(bad="lightgrey")
    fig, ax = plt.subplots(figsize=(1.0 + 0.9 * len(lengths), 1.0 + 0.45 * len(depths)))
    im = ax.imshow(np.ma.masked_invalid(acc_DL), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
    for i in range(len(depths)):
        for j in range(len(lengths)):
            v = acc_DL[i, j]
            ax.text(j, i, "n/a" if np.isnan(v) else f"{v:.2f}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(lengths)), [f"{L:,}" for L in lengths], rotation=45)
    ax.set_yticks(range(len(depths)), [f"{100 * d:.0f}%" for d in depths])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("needle depth")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label="exact-match accuracy")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def layer_heatmaps(arrays: Sequence[tuple[str, np.ndarray]], path: Path, *, xlabel: str, ylabel: str,
                   title: str, cmap: str = "viridis") -> Path:
    """One panel per (name, array[rows, cols]) side by side, each with its own colour bar."""
    plt = _pyplot()
    n = len(arrays)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.4), squeeze=False)
    for ax, (name, arr) in zip(axes[0], arrays):
        im = ax.imshow(np.asarray(arr, dtype=np.float64), aspect="auto", cmap=cmap, origin="lower",
                       interpolation="nearest")
        ax.set_title(name)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        fig.colorbar(im, ax=ax)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
