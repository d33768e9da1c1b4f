"""Tables for any grid, without a module per grid: ``phaselab tables GRID --metric M --rows A
--cols B`` pivots one metric over any axes or metric fields (DESIGN §5.6).

A :class:`Pivot` names the grid, the metric, the row and column fields and filters. A field is an
axis of the grid by its name (``pe``, ``lr``) or a field of the metric rows (``context_len``,
``depth``, ``task``, ``split``, ``role`` = the grid's stage name, ``stage_kind``). Several row
fields make one row per combination that occurs; several column fields one column per
combination (``64 / valid``). :func:`pivot_spec` turns it into a :class:`TableSpec`, so the
aggregation and rendering are the paper tables' own: mean ± sample std over the seeds of the grid
(the ``seed`` axis), a hole (``—``) where a cell of the grid has no value, ``(n=k/N)`` where seeds
are missing, the best mean per column in bold, a provenance footnote.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from phaselab.catalog.reports.tables.spec import Dim, TableSpec

METRIC_FIELDS = ("context_len", "depth", "task", "split", "role", "stage_kind", "stage_name", "step", "unit")
COLS = "_cols"   # the derived field holding a row's column combination
LOWER_IS_BETTER = ("ppl", "nll", "loss", "bpc", "perplexity")


@dataclass(frozen=True, kw_only=True)
class Pivot:
    """What to tabulate (see the module docstring). ``where``: field -> required value."""

    grid: str
    metric: str
    rows: tuple[str, ...]
    cols: tuple[str, ...]
    where: Mapping[str, Any] = field(default_factory=dict)
    seed_axis: str = "seed"
    better: str | None = None      # "min" | "max"; None: min for loss-like metrics, else max
    decimals: int = 2

    @property
    def name(self) -> str:
        return f"{self.grid}.{self.metric}.{'+'.join(self.rows)}.{'+'.join(self.cols)}".replace("/", "_")


def _field(name: str, axes: set[str]) -> str:
    if name in axes:
        return f"axes.{name}"
    if name in METRIC_FIELDS or name.startswith("axes."):
        return name
    raise ValueError(f"unknown table field {name!r}: not an axis of the grid ({', '.join(sorted(axes)) or 'none'}) "
                     f"nor a metric field ({', '.join(METRIC_FIELDS)})")


def _value(row: Mapping[str, Any], name: str) -> Any:
    return (row.get("axes") or {}).get(name[5:]) if name.startswith("axes.") else row.get(name)


def _ordered(values: Iterable[Any]) -> list[Any]:
    """Distinct values: numbers ascending, others in first-seen order (the grid's own order)."""
    seen = list(dict.fromkeys(v for v in values if v is not None))
    if seen and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in seen):
        return sorted(seen)
    return seen


def pivot_spec(p: Pivot, rows: Sequence[Mapping[str, Any]], cells: Sequence[Mapping[str, Any]]
               ) -> tuple[TableSpec, list[dict[str, Any]]]:
    """(the table spec, the metric rows it reads: the matching rows with their column
    combination in :data:`COLS`). ``cells``: the grid's cells (their ``axes``), whose axis values
    are the expected rows and columns (a cell without a value is a hole). ValueError for an
    unknown field or a metric the grid has no value of (naming those it has)."""
    axes = {k for c in cells for k in (c.get("axes") or {})}
    row_f = [_field(n, axes) for n in p.rows]
    col_f = [_field(n, axes) for n in p.cols]
    seed_f = f"axes.{p.seed_axis}"
    matching = [dict(r) for r in rows if r.get("name") == p.metric
                and all(_value(r, _field(k, axes)) == v for k, v in p.where.items())]
    if not matching:
        names = sorted({str(r.get("name")) for r in rows})
        raise ValueError(f"grid {p.grid!r} has no {p.metric!r} values{' matching ' + str(dict(p.where)) if p.where else ''}; "
                         f"its metrics: {', '.join(names) or 'none'}")
    cell_rows = [{"axes": c.get("axes") or {}} for c in cells]
    for r in matching:
        r[COLS] = tuple(_value(r, f) for f in col_f)
    dims = tuple(Dim(field=f, title=n, values=tuple(_ordered(_value(r, f) for r in [*cell_rows, *matching])))
                 for n, f in zip(p.rows, row_f, strict=True))
    keys = _combos(row_f, cell_rows if all(f.startswith("axes.") for f in row_f) else matching, dims)
    col_values = _combos(col_f, cell_rows if all(f.startswith("axes.") for f in col_f) else matching, None)
    seeds = tuple(_ordered(_value(c, seed_f) for c in cell_rows)) or (None,)
    better = p.better or ("min" if any(w in p.metric.lower() for w in LOWER_IS_BETTER) else "max")
    if len(col_f) == 1:   # one field: its own values (numeric columns can be drawn as curves)
        cols = Dim(field=col_f[0], title=p.cols[0], values=tuple(v for (v,) in col_values))
    else:
        cols = Dim(field=COLS, title=" / ".join(p.cols), values=tuple(col_values), parts=tuple(col_f),
                   labels={v: " / ".join(map(str, v)) for v in col_values})
    spec = TableSpec(name=p.name, title=f"{p.metric} by {', '.join(p.rows)} × {', '.join(p.cols)} (grid {p.grid})",
                     grid=p.grid, rows=dims, row_keys=tuple(keys), metric=p.metric, better=better, cols=cols,
                     seed_field=seed_f, seeds=seeds, decimals=p.decimals)
    return spec, matching


def _combos(fields: Sequence[str], rows: Sequence[Mapping[str, Any]], dims: Sequence[Dim] | None) -> list[tuple]:
    """The combinations of ``fields`` that occur in ``rows``, in the order of each field's values."""
    combos = {tuple(_value(r, f) for f in fields) for r in rows}
    combos = {c for c in combos if all(v is not None for v in c)}
    orders = [list(d.values) for d in dims] if dims is not None else \
        [_ordered(_value(r, f) for r in rows) for f in fields]
    return sorted(combos, key=lambda c: tuple(o.index(v) for o, v in zip(orders, c, strict=True)))
