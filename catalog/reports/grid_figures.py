"""Figures of any grid from the catalog, without a module per grid (``phaselab figures GRID``):

- :func:`length_curves`: a metric (perplexity by default) against context length, one line per
  row combination (``--rows pe``), seed mean with a ± std band, on a log-2 axis ticked at the
  evaluated lengths, the lengths the models were trained at marked (:func:`length_marks`: the
  pretraining length and, where models were trained on, the continued-pretraining length, read
  from the stages above the evaluations);
- :func:`learning_curves`: training/validation loss per cell group with a seed band, from each
  training stage's per-step log (``run_folder.STEPS_FILE``) under the runs root (:mod:`curves`);
- :func:`niah_heatmaps`: NIAH accuracy over context length × needle depth, one panel per row
  combination, seed means.

Each reads a catalog or a Parquet export (:func:`read_export`, ``phaselab figures GRID
--from-export DIR``) as committed under ``docs/results/``: there the cells are those with values
and the stages above a stage are the upstreams its cache key records.

Looks (labels with units, line styles and markers, TrueType fonts) come from :mod:`plotstyle`.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phaselab.catalog.reports.plotstyle import field_label, pyplot, save, value_label
from phaselab.catalog.reports.tables.pivot import Pivot, pivot_spec
from phaselab.catalog.reports.tables.spec import Dim, build
from phaselab.catalog.store.walks import ancestors
from phaselab.catalog.tracking.run_folder import STEPS_FILE, read_steps, steps_path

if TYPE_CHECKING:
    from phaselab.catalog.store.api import CatalogStore


@dataclass(frozen=True)
class ExportSource:
    """One grid of a Parquet export in place of a catalog: its metric rows (metrics-frame
    shape), the cells that have values, and per stage hash its kind, config and upstream hashes."""

    grid: str
    rows: list[dict[str, Any]]
    cells: list[dict[str, Any]]
    stages: dict[str, dict[str, Any]]


def read_export(export_dir: Path, grid: str) -> ExportSource:
    """``grid`` from the export in ``export_dir`` (``phaselab export``); ValueError when the
    folder or the grid's export is missing."""
    from phaselab.catalog.reports.tables import export_rows

    export_dir = Path(export_dir)
    if not export_dir.is_dir():
        raise ValueError(f"--from-export: no folder {export_dir}")
    meta, rows = export_rows(export_dir, (grid,))
    if not meta:
        raise ValueError(f"no export of grid {grid!r} in {export_dir} (no _export_{grid}.json)")
    cells = list({json.dumps(r["axes"], sort_keys=True): {"axes": r["axes"]} for r in rows}.values())
    return ExportSource(grid=grid, rows=rows, cells=cells, stages=_export_stages(export_dir, grid))


def _export_stages(export_dir: Path, grid: str) -> dict[str, dict[str, Any]]:
    """{stage hash: {kind, config, upstream}} of the export's stage table ({} without one)."""
    import pyarrow.dataset as ds

    folder = export_dir / "stages"
    if not folder.is_dir():
        return {}
    table = ds.dataset(folder, format="parquet", partitioning="hive").to_table(filter=ds.field("grid") == grid)
    stages = {}
    for r in table.to_pylist():
        parts = json.loads(r.get("cache_key_parts_json") or "{}")
        upstream = (parts.get("parts", parts).get("upstream") or {}).values()
        stages[r["stage_hash"]] = {"kind": r.get("stage_kind"), "config": json.loads(r.get("config_json") or "{}"),
                                   "upstream": [u for u in upstream if isinstance(u, str)]}
    return stages


def _grid_rows(store: CatalogStore | ExportSource, grid: str) -> tuple[list[dict], list[dict]]:
    if isinstance(store, ExportSource):
        if store.grid != grid:
            raise ValueError(f"the export holds grid {store.grid!r}, not {grid!r}")
        return store.rows, store.cells
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


def default_metric(store: CatalogStore | ExportSource, grid: str) -> str:
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


def default_rows(store: CatalogStore | ExportSource, grid: str, seed_axis: str = "seed") -> tuple[str, ...]:
    """The lines of ``phaselab figures GRID`` without ``--rows``: ``pe`` where it is a scalar
    axis, else every scalar axis but the seed (``variant``, ``phase``, ...)."""
    _, cells = _grid_rows(store, grid)
    axes = _scalar_axes(cells, seed_axis)
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


def _length_spec(store: CatalogStore | ExportSource, pivot: Pivot, title: str | None = None) -> tuple[Any, list[dict]]:
    """(table spec, its metric rows) of ``pivot.metric`` by context length, rows separated and
    labelled as the figure's legend reads (encodings by their papers' names)."""
    rows, cells = _grid_rows(store, pivot.grid)
    pivot = separate_rows(pivot, [r for r in rows if r.get("context_len") is not None], cells)
    spec, matching = pivot_spec(replace(pivot, cols=("context_len",)), rows, cells)
    spec = replace(spec, title=title or f"{pivot.grid}: {pivot.metric} by context length",
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


def length_curves(store: CatalogStore | ExportSource, pivot: Pivot, path_base: Path, *,
                  train_len: int | None = None, marks: Mapping[int, str] | None = None,
                  title: str | None = None, formats: Sequence[str] = ("png", "pdf")) -> list[Path]:
    """``pivot.metric`` against ``context_len`` (``pivot.cols`` is ignored), see the module
    docstring. Lengths are marked by ``train_len`` ("train length N") and ``marks`` ({length:
    label}); with neither, by :func:`default_marks`. ``title`` replaces "GRID: METRIC by context
    length". A metric with no context length (a task's test NLL or accuracy) is drawn as bars
    per line instead."""
    from phaselab.catalog.reports.figures import plot_curves

    rows, _ = _grid_rows(store, pivot.grid)
    if not any(r.get("name") == pivot.metric and r.get("context_len") is not None for r in rows):
        return metric_bars(store, pivot, path_base, formats=formats)
    spec, matching = _length_spec(store, pivot, title)
    if train_len is None and marks is None:
        train_len, marks = default_marks(store, sorted({r["stage_hash"] for r in matching}))
    return plot_curves(build(spec, matching), path_base, logx=True, styled=True, train_len=train_len,
                       marks=marks, logy=pivot.metric in ("ppl",), formats=formats)


# Stage kinds that continue training an upstream checkpoint, and how their length reads.
_CONTINUED = {"cpt": "continued pretraining length", "finetune": "fine-tuning length"}


def _chain(store: CatalogStore | ExportSource, stage_hash: str) -> list[tuple[str, Mapping[str, Any]]]:
    """(kind, config) of ``stage_hash`` and every stage above it, nearest first."""
    if isinstance(store, ExportSource):
        order: list[str] = []
        queue = [stage_hash]
        while queue:
            h = queue.pop(0)
            if h not in order and h in store.stages:
                order.append(h)
                queue += store.stages[h]["upstream"]
        return [(store.stages[h]["kind"], store.stages[h]["config"] or {}) for h in order]
    found = [store.get_stage(h) for h in [stage_hash, *(a for a, _, _ in ancestors(store, stage_hash))]]
    return [(r.kind, r.config or {}) for r in found if r is not None]


def _block_size(section: Any) -> int | None:
    size = section.get("block_size") if isinstance(section, Mapping) else None
    return int(size) if size else None


def _trained_lengths(store: CatalogStore | ExportSource,
                     stage_hashes: Sequence[str]) -> tuple[dict[int, str], dict[int, str]]:
    """(base, continued) {length: label} of :func:`length_marks`."""
    base: dict[int, str] = {}
    continued: dict[int, str] = {}
    for h in stage_hashes:
        for kind, config in _chain(store, h):
            if kind in _CONTINUED:
                size = _block_size(config.get("extend")) or _block_size(config.get("data"))
                if size:
                    continued.setdefault(size, f"{_CONTINUED[kind]} {size}")
            elif size := _block_size(config.get("model")):
                base.setdefault(size, f"{'pretraining' if kind == 'pretrain' else 'training'} length {size}")
                break
    return base, continued


def length_marks(store: CatalogStore | ExportSource, stage_hashes: Sequence[str]) -> dict[int, str]:
    """{length: label} of the lengths the models of ``stage_hashes`` were trained at, by length:
    walking up from each stage, a continued-training stage (cpt, finetune) gives its length
    (``extend``'s block size, else ``data``'s: "continued pretraining length N"); the nearest
    stage with a ``model.block_size`` gives the base length ("pretraining length N", "training
    length N" for another kind) and ends the walk. A base length wins over a continued one it equals."""
    base, continued = _trained_lengths(store, stage_hashes)
    return dict(sorted({**continued, **base}.items()))


def default_marks(store: CatalogStore | ExportSource,
                  stage_hashes: Sequence[str]) -> tuple[int | None, dict[int, str] | None]:
    """(train_len, marks) of a length figure without ``--train-len`` or ``--mark``: the models'
    one training length ("train length N") when none was trained further, else every length of
    :func:`length_marks` (e.g. the pretraining and the continued-pretraining length)."""
    base, continued = _trained_lengths(store, stage_hashes)
    if continued:
        return None, dict(sorted({**continued, **base}.items()))
    return (next(iter(base)), None) if len(base) == 1 else (None, None)


def metric_bars(store: CatalogStore | ExportSource, pivot: Pivot, path_base: Path, *,
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


def learning_curves(store: CatalogStore | ExportSource, grid: str, runs_root: Path, path_base: Path, *,
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


def niah_heatmaps(store: CatalogStore | ExportSource, pivot: Pivot, path_base: Path, *,
                  title: str | None = None, formats: Sequence[str] = ("png", "pdf")) -> list[Path]:
    """NIAH accuracy (``pivot.metric``, default niah_acc) over length × depth, one panel per row
    group (rows separated as in :func:`separate_rows`, so two stages never share a panel; at most
    :data:`NIAH_COLUMNS` panels a line), titled by its row values; ``pivot.where`` filters. The
    colour scale is 0..1 whatever the values (all zeros read as one colour); ``title`` above all."""
    groups = niah_groups(store, pivot)
    n = len(groups)
    ncols = min(n, NIAH_COLUMNS)
    nrows = math.ceil(n / ncols)
    plt = pyplot()
    fig, axs = plt.subplots(nrows, ncols, figsize=(3.2 * ncols + 1.2, 3.0 * nrows + 0.5 + 0.3 * bool(title)),
                            squeeze=False, layout="constrained")
    flat = list(axs.flat)
    for ax, (label, grid) in zip(flat, groups.items(), strict=False):
        im = _niah_panel(ax, grid, label)
    for ax in flat[n:]:
        ax.set_visible(False)
    fig.colorbar(im, ax=flat[:n], label="exact-match accuracy (seed mean)", shrink=0.9)
    if title:
        fig.suptitle(title, fontsize=10)
    return save(fig, path_base, formats)


# Panels of the NIAH figure per line before it wraps.
NIAH_COLUMNS = 4


def niah_groups(store: CatalogStore | ExportSource,
                pivot: Pivot) -> dict[str, dict[tuple[int, float], list[float]]]:
    """{panel title: {(context length, depth): values over seeds}} of :func:`niah_heatmaps`, in
    the order the rows come (the grid's cells and stages). ValueError when no value has a length
    and a depth."""
    rows, cells = _grid_rows(store, pivot.grid)
    axes = {k for c in cells for k in (c.get("axes") or {})}
    mine = [r for r in rows if r["name"] == pivot.metric and r.get("context_len") is not None
            and r.get("depth") is not None
            and all(_value(r, k.removeprefix("axes."), axes) == v for k, v in pivot.where.items())]
    if not mine:
        raise ValueError(f"grid {pivot.grid!r} has no {pivot.metric!r} values with a context length and depth"
                         + (f" where {pivot.where}" if pivot.where else ""))
    pivot = separate_rows(pivot, mine, cells, by=("context_len", "depth"))
    keyed: dict[tuple, dict[tuple[int, float], list[float]]] = {}
    for r in mine:
        key = tuple(_value(r, f, axes) for f in pivot.rows)
        keyed.setdefault(key, {}).setdefault((int(r["context_len"]), float(r["depth"])), []).append(float(r["value"]))
    return {", ".join(value_label(f, v) for f, v in zip(pivot.rows, key, strict=True)): grid
            for key, grid in keyed.items()}


def _niah_panel(ax: Any, grid: Mapping[tuple[int, float], list[float]], label: str) -> Any:
    """One heat map: depth down, length across, seed means on a fixed 0..1 scale."""
    lengths, depths = sorted({L for L, _ in grid}), sorted({d for _, d in grid})
    acc = [[statistics.fmean(grid[(L, d)]) if (L, d) in grid else float("nan") for L in lengths] for d in depths]
    im = ax.imshow(acc, cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(lengths)), [f"{L:,}" for L in lengths], rotation=45)
    ax.set_yticks(range(len(depths)), [f"{100 * d:.0f}%" for d in depths])
    ax.set_xlabel(field_label("context_len"))
    ax.set_ylabel(field_label("depth"))
    ax.set_title(label, fontsize=9)
    return im
