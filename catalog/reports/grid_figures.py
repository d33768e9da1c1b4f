"""Figures of any grid from the catalog, without a module per grid (``phaselab figures GRID``):

- :func:`length_curves`: a metric (perplexity by default) against context length, one line per
  row combination (``--rows pe``), seed mean with a ± std band, on a log-2 axis ticked at the
  evaluated lengths, the training length marked (read from the trained upstream's config);
- :func:`learning_curves`: training/validation loss per cell group with a seed band, from each
  training stage's per-step log (``run_folder.STEPS_FILE``) under the runs root (:mod:`curves`);
- :func:`niah_heatmaps`: NIAH accuracy over context length × needle depth, one panel per row
  combination, seed means.

Looks (labels with units, line styles and markers, TrueType fonts) come from :mod:`plotstyle`.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phaselab.catalog.reports.plotstyle import field_label, pyplot, save, value_label
from phaselab.catalog.reports.tables.pivot import Pivot, pivot_spec
from phaselab.catalog.reports.tables.spec import Dim, build
from phaselab.catalog.store.walks import train_lengths
from phaselab.catalog.tracking.run_folder import STEPS_FILE, read_steps, steps_path

if TYPE_CHECKING:
    from phaselab.catalog.store.api import CatalogStore


def _grid_rows(store: CatalogStore, grid: str) -> tuple[list[dict], list[dict]]:
    g = store.reads.get_grid(grid)
    if g is None:
        raise ValueError(f"grid {grid!r} is not in the catalog")
    return store.reads.metrics_frame(grid=grid), store.reads.cells_for_grid(g["id"])


# Metrics a figure draws by default, in this order (the first the grid has): the length figure
# prefers one measured at several context lengths.
DEFAULT_METRICS = ("ppl", "nll", "acc", "niah_acc", "loss")
# Fields that tell apart two values of one line and length (another eval stage, task or split),
# tried in this order after the grid's other axes.
_SEPARATORS = ("stage_name", "task", "split", "role")


def default_metric(store: CatalogStore, grid: str) -> str:
    """The metric ``phaselab figures GRID`` draws without ``--metric``: the first of
    DEFAULT_METRICS the grid has at a context length, else the first it has at all, else the
    first metric it has. ValueError when it has none."""
    rows, _ = _grid_rows(store, grid)
    with_len = {r["name"] for r in rows if r.get("context_len") is not None}
    names = {r["name"] for r in rows}
    for pool in (with_len, names):
        for m in DEFAULT_METRICS:
            if m in pool:
                return m
    if not names:
        raise ValueError(f"grid {grid!r} has no metrics in the catalog yet")
    return min(with_len or names)


def _scalar_axes(cells: Sequence[Mapping[str, Any]], seed_axis: str = "seed") -> list[str]:
    """The grid's axes (but the seed) whose values are all plain scalars, in first-seen order
    (an axis of mappings, such as a zipped ``pe: {kind: ...}``, names no line)."""
    seen: dict[str, bool] = {}
    for c in cells:
        for k, v in (c.get("axes") or {}).items():
            seen[k] = seen.get(k, True) and (v is None or isinstance(v, (str, int, float, bool)))
    return [k for k, ok in seen.items() if ok and k != seed_axis]


def default_rows(store: CatalogStore, grid: str, seed_axis: str = "seed") -> tuple[str, ...]:
    """The lines of ``phaselab figures GRID`` without ``--rows``: ``pe`` where it is a scalar
    axis, else every scalar axis but the seed (``variant``, ``phase``, ...)."""
    g = store.reads.get_grid(grid)
    if g is None:
        raise ValueError(f"grid {grid!r} is not in the catalog")
    axes = _scalar_axes(store.reads.cells_for_grid(g["id"]), seed_axis)
    return ("pe",) if "pe" in axes else tuple(axes)


def _value(row: Mapping[str, Any], name: str, axes: set[str]) -> Any:
    return (row.get("axes") or {}).get(name) if name in axes else row.get(name)


def separate_rows(pivot: Pivot, rows: Sequence[Mapping[str, Any]], cells: Sequence[Mapping[str, Any]],
                  by: Sequence[str] = ("context_len",)) -> Pivot:
    """``pivot`` with row fields added until no line has two values at one ``by`` value and
    seed: the grid's other axes first, then ``_SEPARATORS`` (quickstart's ``ppl`` and
    ``ppl_yarn`` stages become two lines per encoding). Unchanged when nothing collides."""
    axes = {k for c in cells for k in (c.get("axes") or {})}
    mine = [r for r in rows if r.get("name") == pivot.metric
            and all(_value(r, k.removeprefix("axes."), axes) == v for k, v in pivot.where.items())]
    fields = list(pivot.rows)

    def collides() -> bool:
        seen: dict[tuple, str] = {}
        for r in mine:
            key = tuple(_value(r, f, axes) for f in (*fields, *by, pivot.seed_axis))
            if seen.setdefault(key, r["stage_hash"]) != r["stage_hash"]:
                return True
        return False

    extra = [a for a in _scalar_axes(cells, pivot.seed_axis) if a not in fields] + list(_SEPARATORS)
    for f in extra:
        if not collides():
            break
        if len({_value(r, f, axes) for r in mine}) > 1:
            fields.append(f)
    return replace(pivot, rows=tuple(fields))


def default_length_pivot(store: CatalogStore, grid: str, seed_axis: str = "seed") -> Pivot:
    """What ``phaselab figures GRID`` draws with its defaults, as a table's pivot: the default
    metric by context length, one row per line of the figure (rows separated as the figure does)."""
    pivot = Pivot(grid=grid, metric=default_metric(store, grid), rows=default_rows(store, grid, seed_axis),
                  cols=("context_len",), seed_axis=seed_axis)
    rows, cells = _grid_rows(store, grid)
    return separate_rows(pivot, [r for r in rows if r.get("context_len") is not None], cells)


def _length_spec(store: CatalogStore, pivot: Pivot) -> tuple[Any, list[dict]]:
    """(table spec, its metric rows) of ``pivot.metric`` by context length, rows separated and
    labelled as the figure's legend reads (encodings by their papers' names)."""
    rows, cells = _grid_rows(store, pivot.grid)
    pivot = separate_rows(pivot, [r for r in rows if r.get("context_len") is not None], cells)
    spec, matching = pivot_spec(replace(pivot, cols=("context_len",)), rows, cells)
    spec = replace(spec, title=f"{pivot.grid}: {pivot.metric} by context length",
                   cols=replace(spec.cols, title=field_label("context_len")),
                   rows=tuple(Dim(field=d.field, title=d.title, values=d.values,
                                  labels={v: value_label(d.field, v) for v in d.values}) for d in spec.rows))
    return spec, matching


def length_table(store: CatalogStore, pivot: Pivot, fmt: str = "md") -> str:
    """The table of :func:`length_curves`' figure (mean ± std over seeds per length)."""
    from datetime import UTC, datetime

    from phaselab.catalog.reports.tables.spec import render

    spec, matching = _length_spec(store, pivot)
    return render(build(spec, matching), fmt, datetime.now(UTC))


def length_curves(store: CatalogStore, pivot: Pivot, path_base: Path, *, train_len: int | None = None,
                  formats: Sequence[str] = ("png", "pdf")) -> list[Path]:
    """``pivot.metric`` against ``context_len`` (``pivot.cols`` is ignored), see the module
    docstring. The training length is marked when the evaluated models share one. A metric
    with no context length (a task's test NLL or accuracy) is drawn as bars per line instead."""
    from phaselab.catalog.reports.figures import plot_curves

    rows, _ = _grid_rows(store, pivot.grid)
    if not any(r.get("name") == pivot.metric and r.get("context_len") is not None for r in rows):
        return metric_bars(store, pivot, path_base, formats=formats)
    spec, matching = _length_spec(store, pivot)
    if train_len is None:
        lengths = train_lengths(store, sorted({r["stage_hash"] for r in matching}))
        train_len = lengths[0] if len(lengths) == 1 else None
    return plot_curves(build(spec, matching), path_base, logx=True, styled=True, train_len=train_len,
                       logy=pivot.metric in ("ppl",), formats=formats)


def metric_bars(store: CatalogStore, pivot: Pivot, path_base: Path, *,
                formats: Sequence[str] = ("png", "pdf")) -> list[Path]:
    """``pivot.metric`` as one bar per line (``pivot.rows``, separated as in
    :func:`separate_rows`), the seed mean with a ± std error bar."""
    from phaselab.catalog.reports.plotstyle import metric_label

    rows, cells = _grid_rows(store, pivot.grid)
    pivot = separate_rows(pivot, rows, cells, by=())
    axes = {k for c in cells for k in (c.get("axes") or {})}
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        if r.get("name") == pivot.metric and all(_value(r, k.removeprefix("axes."), axes) == v
                                                 for k, v in pivot.where.items()):
            groups.setdefault(tuple(_value(r, f, axes) for f in pivot.rows), []).append(float(r["value"]))
    if not groups:
        raise ValueError(f"grid {pivot.grid!r} has no {pivot.metric!r} values")
    keys = sorted(groups, key=str)
    labels = [" ".join(value_label(f, v) for f, v in zip(pivot.rows, k, strict=True)) for k in keys]
    means = [statistics.fmean(groups[k]) for k in keys]
    stds = [statistics.stdev(groups[k]) if len(groups[k]) > 1 else 0.0 for k in keys]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(keys) + 1.5), 3.6))
    ax.bar(range(len(keys)), means, yerr=stds, capsize=4, color="0.6", edgecolor="black")
    ax.set_xticks(range(len(keys)), labels, rotation=30 if len(keys) > 4 else 0, ha="right" if len(keys) > 4 else "center")
    ax.set_ylabel(metric_label(pivot.metric) + " (seed mean ± std)")
    ax.set_title(f"{pivot.grid}: {pivot.metric} by {', '.join(field_label(f) for f in pivot.rows)}", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return save(fig, path_base, formats)


def learning_curves(store: CatalogStore, grid: str, runs_root: Path, path_base: Path, *,
                    metrics: Sequence[str] = ("train/loss", "valid/loss"),
                    formats: Sequence[str] = ("png", "pdf")) -> list[Path]:
    """One panel per metric, one line per cell group and training stage, seed min..max band."""
    from phaselab.catalog.reports.curves import plot_learning_curves

    rows, _ = _grid_rows(store, grid)
    axes_of: dict[str, Mapping[str, Any]] = {}
    points: list[dict[str, Any]] = []
    for r in rows:   # every stage with results (a training stage has its final evaluation's)
        axes_of.setdefault(r["stage_hash"], r["axes"])
    for h in sorted(axes_of):
        steps = steps_path(Path(runs_root) / h)
        if steps.is_file():
            name = next((r["stage_name"] for r in rows if r["stage_hash"] == h), None)
            points += [{**row, "stage_hash": h, "stage": name} for row in read_steps(steps)]
    if not points:
        raise ValueError(f"no training steps of grid {grid!r} under {runs_root} ({STEPS_FILE})")
    if "valid/acc" not in metrics and any("valid/acc" in p for p in points):   # an accuracy task
        metrics = (*metrics, "valid/acc")
    paths = plot_learning_curves(points, axes_of, path_base, metrics=metrics, title=f"{grid}: learning curves",
                                 formats=formats)
    if "valid/acc" in metrics:   # when each run left its plateau, beside the figure
        from phaselab.catalog.reports.curves import ACC_THRESHOLDS, crossings, crossings_markdown

        table = path_base.with_name(path_base.name + "_crossings.md")
        table.write_text(crossings_markdown(crossings(points, axes_of, "valid/acc", ACC_THRESHOLDS), "valid/acc"))
        paths.append(table)
    return paths


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
