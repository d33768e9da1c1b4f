"""Figures of any grid from the catalog, without a module per grid (``phaselab figures GRID``):

- :func:`length_curves`: a metric (perplexity by default) against context length, one line per
  row combination (``--rows pe``), seed mean with a ± std band, on a log-2 axis ticked at the
  evaluated lengths, the training length marked (read from the trained upstream's config);
- :func:`learning_curves`: training/validation loss per cell group with a seed band, from each
  training stage's ``steps.jsonl`` under the runs root (:mod:`curves`);
- :func:`niah_heatmaps`: NIAH accuracy over context length × needle depth, one panel per row
  combination, seed means.

Looks (labels with units, line styles and markers, TrueType fonts) come from :mod:`plotstyle`.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phaselab.catalog.plotstyle import field_label, pyplot, save, value_label
from phaselab.catalog.tables.pivot import Pivot, pivot_spec
from phaselab.catalog.tables.spec import Dim, build

if TYPE_CHECKING:
    from phaselab.catalog.store import CatalogStore


def _grid_rows(store: CatalogStore, grid: str) -> tuple[list[dict], list[dict]]:
    g = store.get_grid(grid)
    if g is None:
        raise ValueError(f"grid {grid!r} is not in the catalog")
    return store.metrics_frame(grid=grid), store.cells_for_grid(g["id"])


def train_lengths(store: CatalogStore, stage_hashes: Sequence[str]) -> list[int]:
    """The distinct ``model.block_size`` of the nearest trained stage above each stage (itself
    included): the length its model saw in training."""
    from phaselab.catalog.lineage import ancestors

    found: set[int] = set()
    for h in stage_hashes:
        for other in [h, *(a for a, _, _ in ancestors(store, h))]:
            row = store.get_stage(other)
            model = (row.config or {}).get("model") if row is not None else None
            if isinstance(model, Mapping) and model.get("block_size"):
                found.add(int(model["block_size"]))
                break
    return sorted(found)


def length_curves(store: CatalogStore, pivot: Pivot, path_base: Path, *, train_len: int | None = None,
                  formats: Sequence[str] = ("png", "pdf")) -> list[Path]:
    """``pivot.metric`` against ``context_len`` (``pivot.cols`` is ignored), see the module
    docstring. The training length is marked when the evaluated models share one."""
    from phaselab.catalog.figures import plot_curves

    rows, cells = _grid_rows(store, pivot.grid)
    spec, matching = pivot_spec(replace(pivot, cols=("context_len",)), rows, cells)
    spec = replace(spec, title=f"{pivot.grid}: {pivot.metric} by context length",
                   cols=replace(spec.cols, title=field_label("context_len")),
                   rows=tuple(Dim(field=d.field, title=d.title, values=d.values,
                                  labels={v: value_label(d.field, v) for v in d.values}) for d in spec.rows))
    if train_len is None:
        lengths = train_lengths(store, sorted({r["stage_hash"] for r in matching}))
        train_len = lengths[0] if len(lengths) == 1 else None
    return plot_curves(build(spec, matching), path_base, logx=True, styled=True, train_len=train_len,
                       logy=pivot.metric in ("ppl",), formats=formats)


def learning_curves(store: CatalogStore, grid: str, runs_root: Path, path_base: Path, *,
                    metrics: Sequence[str] = ("train/loss", "valid/loss"),
                    formats: Sequence[str] = ("png", "pdf")) -> list[Path]:
    """One panel per metric, one line per cell group and training stage, seed min..max band."""
    from phaselab.catalog.curves import plot_learning_curves

    rows, _ = _grid_rows(store, grid)
    axes_of: dict[str, Mapping[str, Any]] = {}
    points: list[dict[str, Any]] = []
    for r in rows:   # every stage with results (a training stage has its final evaluation's)
        axes_of.setdefault(r["stage_hash"], r["axes"])
    for h in sorted(axes_of):
        steps = Path(runs_root) / h / "steps.jsonl"
        if steps.is_file():
            name = next((r["stage_name"] for r in rows if r["stage_hash"] == h), None)
            points += [{**json.loads(ln), "stage_hash": h, "stage": name}
                       for ln in steps.read_text().splitlines() if ln.strip()]
    if not points:
        raise ValueError(f"no training steps of grid {grid!r} under {runs_root} (steps.jsonl)")
    return plot_learning_curves(points, axes_of, path_base, metrics=metrics, title=f"{grid}: learning curves",
                                formats=formats)


def niah_heatmaps(store: CatalogStore, pivot: Pivot, path_base: Path, *,
                  formats: Sequence[str] = ("png", "pdf")) -> list[Path]:
    """NIAH accuracy (``pivot.metric``, default niah_acc) over length × depth per row group."""
    rows, cells = _grid_rows(store, pivot.grid)
    axes = {k for c in cells for k in (c.get("axes") or {})}
    groups: dict[tuple, dict[tuple[int, float], list[float]]] = {}
    for r in rows:
        if r["name"] != pivot.metric or r.get("context_len") is None or r.get("depth") is None:
            continue
        key = tuple((r["axes"] or {}).get(f) if f in axes else r.get(f) for f in pivot.rows)
        groups.setdefault(key, {}).setdefault((int(r["context_len"]), float(r["depth"])), []).append(float(r["value"]))
    if not groups:
        raise ValueError(f"grid {pivot.grid!r} has no {pivot.metric!r} values with a context length and depth")
    plt = pyplot()
    fig, axs = plt.subplots(1, len(groups), figsize=(3.2 * len(groups) + 1.0, 3.4), squeeze=False)
    for ax, (key, grid) in zip(axs[0], sorted(groups.items(), key=lambda kv: str(kv[0])), strict=True):
        lengths, depths = sorted({L for L, _ in grid}), sorted({d for _, d in grid})
        acc = [[statistics.fmean(grid[(L, d)]) if (L, d) in grid else float("nan") for L in lengths] for d in depths]
        im = ax.imshow(acc, cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(len(lengths)), [f"{L:,}" for L in lengths], rotation=45)
        ax.set_yticks(range(len(depths)), [f"{100 * d:.0f}%" for d in depths])
        ax.set_xlabel(field_label("context_len"))
        ax.set_ylabel(field_label("depth"))
        ax.set_title(", ".join(value_label(f, v) for f, v in zip(pivot.rows, key, strict=True)), fontsize=9)
    fig.colorbar(im, ax=axs[0].tolist(), label="exact-match accuracy (seed mean)")
    return save(fig, path_base, formats)
