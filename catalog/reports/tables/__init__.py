"""Paper tables regenerated from the catalog (DESIGN §5.6): ``phaselab tables [--check-stale]``.

One module per table, each defining ``SPEC`` (a :class:`~phaselab.catalog.reports.tables.spec.TableSpec`);
:data:`TABLES` lists them. A grid with other axis names re-binds a spec with
``dataclasses.replace(spec, grid=..., rows=...)`` and passes it to :func:`render_table`.

Every rendering is recorded in the ``table_build`` table with the inputs it read
(stage hash → ``attempts|finished_at|state``); :func:`check_stale` compares that record with
the catalog now and reports stages that re-ran, changed state, disappeared or newly match.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phaselab.catalog.reports.tables.dataset import from_store
from phaselab.catalog.reports.tables.pivot import Pivot, pivot_spec
from phaselab.catalog.reports.tables.spec import TableSpec, build, render
from phaselab.catalog.store.fingerprint import what_ran

if TYPE_CHECKING:
    from phaselab.catalog.store.api import CatalogStore

TABLES: dict[str, str] = {
    "pope_indirect_indexing": "ii_accuracy",
    "pope_music_nll": "music_nll",
    "pope_owt_ppl": "owt_ppl",
    "pope_owt_ablation": "owt_ablation",
    "pope_pg19_extrapolation": "pg19_extrapolation",
    "pope_downstream": "downstream",
    "tapa_table1": "tapa_ppl",
    "tapa_table2": "tapa_zeroshot",
    "tapa_table3": "tapa_phase",
    "quickstart_ppl": "quickstart",
    "extrapolation_small_ppl": "extrapolation_small",
    "tapa_long_context_small": "tapa_small",
}
EXTENSIONS = {"md": "md", "latex": "tex", "csv": "csv"}


def shipped_dataset(name: str) -> str | None:
    """The ``DATASET`` a table's module names (the data its grid ships with), None for a name
    that is no table of ours (a pivot) or a module without one."""
    module = TABLES.get(name)
    return getattr(importlib.import_module(f"phaselab.catalog.reports.tables.{module}"), "DATASET", None) if module else None


def get_spec(name: str) -> TableSpec:
    if name not in TABLES:
        raise ValueError(f"unknown table {name!r}; known: {sorted(TABLES)}")
    return importlib.import_module(f"phaselab.catalog.reports.tables.{TABLES[name]}").SPEC


@dataclass(frozen=True)
class Rendered:
    name: str
    text: str | None               # None when skipped
    skipped: str | None = None     # why (e.g. the grid is not in the catalog)
    path: Path | None = None


def render_table(store: CatalogStore, spec: TableSpec, fmt: str, *, out_dir: Path | None = None,
                 now: datetime | None = None, record: bool = True, rows: list[dict] | None = None) -> Rendered:
    """Build and render one table from the catalog (or from ``rows``, metrics-frame rows already
    read); write ``out_dir/<name>.<ext>`` if given and record the build for ``--check-stale``."""
    if fmt not in EXTENSIONS:
        raise ValueError(f"table format must be one of {sorted(EXTENSIONS)}, got {fmt!r}")
    present = [g for g in (store.reads.get_grid(name) for name in spec.grids) if g is not None]
    if not present:
        return Rendered(spec.name, None, skipped=f"grid {' / '.join(spec.grids)} not in the catalog")
    built = build(spec, _frame(store, spec) if rows is None else rows, grid_hash="+".join(g["grid_hash"][:12] for g in present),
                  revision=store.revision() or "")
    built.spec = from_store(store, spec, [g["id"] for g in present], built.inputs,   # the data the stages read
                            shipped_dataset(spec.name))
    built.ran = what_ran_summary(store, built.inputs)
    text = render(built, fmt, now or datetime.now(UTC))
    path = _write(spec, fmt, text, out_dir)
    if record:
        store.record_table_build(table_name=spec.name, grid="+".join(spec.grids), fmt=fmt,
                                 inputs=built.inputs,
                                 output_sha256=hashlib.sha256(text.encode()).hexdigest())
    return Rendered(spec.name, text, path=path)


# The fields of what_ran a footnote names: how attention ran and in which numeric mode.
FOOTNOTE_RAN = ("attn_impl", "deterministic", "precision", "graph_mode", "device")


def what_ran_summary(store: CatalogStore, stage_hashes: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Field -> the distinct values the last attempts of the input stages and of every stage above
    them recorded (DESIGN §4): an evaluation's number is also its trained model's, so a table says
    which kernel implementation, determinism, precision and graph mode produced it."""
    from phaselab.catalog.store.walks import above

    seen: dict[str, set[str]] = {k: set() for k in FOOTNOTE_RAN}
    stage_hashes = list(stage_hashes)
    for h in sorted(set(stage_hashes) | above(store, stage_hashes)):
        attempts = [a for a in store.reads.attempts_for_stage(h) if a.get("env")]
        if not attempts:
            continue
        ran = what_ran(attempts[-1]["env"])
        for k in FOOTNOTE_RAN:
            if ran.get(k) is not None:
                seen[k].add(str(ran[k]).lower() if isinstance(ran[k], bool) else str(ran[k]))
    return {k: tuple(sorted(v)) for k, v in seen.items() if v}


def render_pivot(store: CatalogStore, pivot: Pivot, fmt: str, *, out_dir: Path | None = None,
                 now: datetime | None = None) -> Rendered:
    """A generic table of any grid (:mod:`.pivot`), rendered like the paper tables."""
    grid = store.reads.get_grid(pivot.grid)
    if grid is None:
        raise ValueError(f"grid {pivot.grid!r} is not in the catalog")
    spec, rows = pivot_spec(pivot, store.reads.metrics_frame(grid=pivot.grid), store.reads.cells_for_grid(grid["id"]))
    try:
        return render_table(store, spec, fmt, out_dir=out_dir, now=now, rows=rows)
    except ValueError as err:   # two values per cell: the pivot needs another row field or a filter
        raise ValueError(f"{err} (or add a row field such as 'role', or --where role=<stage>)") from None


def render_from_export(spec: TableSpec, export_dir: Path, fmt: str, *, out_dir: Path | None = None,
                       now: datetime | None = None) -> Rendered:
    """A table from a Parquet export (``phaselab export``, as committed under ``docs/results/``)
    instead of a catalog: an export holds the metrics-frame rows of its grid's current version,
    SUCCEEDED stages only, and its provenance file names the grid hash and Alembic revision."""
    if fmt not in EXTENSIONS:
        raise ValueError(f"table format must be one of {sorted(EXTENSIONS)}, got {fmt!r}")
    meta, rows = export_rows(Path(export_dir), spec.grids)
    if not meta:
        return Rendered(spec.name, None, skipped=f"no export of grid {' / '.join(spec.grids)} in {export_dir}")
    return _render_export(spec, rows, meta, fmt, out_dir, now)


def render_pivot_from_export(pivot: Pivot, export_dir: Path, fmt: str, *, out_dir: Path | None = None,
                             now: datetime | None = None) -> Rendered:
    """:func:`render_pivot` over an export. The export lists no cells, so the table's rows and
    columns are the cells that have values (a cell that never ran is absent, not a hole)."""
    if fmt not in EXTENSIONS:
        raise ValueError(f"table format must be one of {sorted(EXTENSIONS)}, got {fmt!r}")
    meta, rows = export_rows(Path(export_dir), (pivot.grid,))
    if not meta:
        raise ValueError(f"no export of grid {pivot.grid!r} in {export_dir}")
    cells = list({json.dumps(r["axes"], sort_keys=True): {"axes": r["axes"]} for r in rows}.values())
    spec, matching = pivot_spec(pivot, rows, cells)
    return _render_export(spec, matching, meta, fmt, out_dir, now)


def export_rows(export_dir: Path, grids: Sequence[str]) -> tuple[dict[str, dict], list[dict[str, Any]]]:
    """({grid: its export provenance}, the metric rows of those grids as metrics-frame rows)."""
    from phaselab.catalog.reports.export import read_metrics

    meta = {g: json.loads(f.read_text()) for g in grids if (f := export_dir / f"_export_{g}.json").is_file()}
    rows = [] if not meta else [{**r, "axes": json.loads(r.pop("axes_json")), "state": "SUCCEEDED"}
                                for r in read_metrics(export_dir).to_pylist() if r["grid"] in meta]
    return meta, rows


def _render_export(spec: TableSpec, rows: list[dict[str, Any]], meta: dict[str, dict], fmt: str,
                   out_dir: Path | None, now: datetime | None) -> Rendered:
    built = build(spec, rows, grid_hash="+".join(m["phaselab.grid_hash"][:12] for m in meta.values()),
                  revision=next(iter(meta.values())).get("phaselab.alembic_revision", ""))
    text = render(built, fmt, now or datetime.now(UTC))
    return Rendered(spec.name, text, path=_write(spec, fmt, text, out_dir))


def _write(spec: TableSpec, fmt: str, text: str, out_dir: Path | None) -> Path | None:
    """``out_dir/<name>.<ext>`` when ``out_dir`` is given (folders created)."""
    if out_dir is None:
        return None
    path = Path(out_dir) / f"{spec.name}.{EXTENSIONS[fmt]}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _frame(store: CatalogStore, spec: TableSpec) -> list[dict]:
    return [row for grid in spec.grids for row in store.reads.metrics_frame(grid=grid)]


def render_all(store: CatalogStore, fmt: str = "md", *, out_dir: Path | None = None,
               names: Iterable[str] | None = None, grids: Mapping[str, str] | None = None,
               now: datetime | None = None, record: bool = True) -> list[Rendered]:
    """Render every table (or ``names``) whose grid is in the catalog. ``grids`` maps a table
    name to another grid name (e.g. a seed-extended copy of the paper grid)."""
    out = []
    for name in (list(names) if names is not None else list(TABLES)):
        spec = get_spec(name)
        if grids and name in grids:
            spec = replace(spec, grid=grids[name])
        out.append(render_table(store, spec, fmt, out_dir=out_dir, now=now, record=record))
    return out


def check_stale(store: CatalogStore, names: Iterable[str] | None = None,
                grids: Mapping[str, str] | None = None) -> dict[str, list[str]]:
    """Table name → reasons it is stale (empty list: up to date). Tables never built are left out.
    A table is stale when an input stage re-ran or changed state, or the set of matching stages
    changed, since its latest recorded build."""
    report: dict[str, list[str]] = {}
    for name in (list(names) if names is not None else list(TABLES)):
        spec = get_spec(name)
        if grids and name in grids:
            spec = replace(spec, grid=grids[name])
        last = store.reads.latest_table_build(spec.name)
        if last is None:
            continue
        now_inputs = build(spec, _frame(store, spec)).inputs
        before: dict[str, str] = last["inputs"]
        reasons = []
        for h in sorted(set(before) | set(now_inputs)):
            if h not in now_inputs:
                reasons.append(f"input stage {h[:12]} no longer contributes (re-running or removed)")
            elif h not in before:
                reasons.append(f"new input stage {h[:12]}")
            elif before[h] != now_inputs[h]:
                reasons.append(f"input stage {h[:12]} changed: {before[h]} -> {now_inputs[h]}")
        report[spec.name] = reasons
    return report
