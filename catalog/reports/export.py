"""``phaselab export GRID --format parquet|csv --out DIR`` (DESIGN §5.10).

Writes two hive-partitioned datasets under ``DIR``::

    DIR/metrics/grid=<grid>/stage_kind=<kind>/part-0.<ext>   one row per metric × cell
    DIR/stages/grid=<grid>/stage_kind=<kind>/part-0.<ext>    one row per stage of the grid
    DIR/_export_<grid>.json                                  the provenance below, for CSV readers

for the grid's current version (its latest submission), with an explicit pyarrow schema
(:func:`metric_schema`, :func:`stage_schema`), a ``schema_version`` column, and schema metadata
``phaselab.grid``, ``phaselab.grid_hash``, ``phaselab.grid_version``,
``phaselab.export_time``, ``phaselab.alembic_revision``, ``phaselab.git_sha`` and
``phaselab.schema_version``. ``existing_data_behavior="delete_matching"`` with a fixed
``basename_template`` makes a re-export replace the grid's partitions instead of adding files.
Cell axes travel as canonical JSON (``axes_json``): their names differ from grid to grid.

pyarrow is imported inside functions only.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from phaselab.catalog.store.api import CatalogStore
from phaselab.catalog.store.fingerprint import git_state, what_ran

SCHEMA_VERSION = 2   # 2: the stages carry what ran (attn_impl, deterministic, precision, graph_mode, device)
FORMATS = ("parquet", "csv")
PARTITION_COLUMNS = ("grid", "stage_kind")

_METRIC_FIELDS = [
    ("schema_version", "int16"), ("grid", "string"), ("stage_kind", "string"), ("cell_id", "int64"),
    ("cell_key", "string"), ("axes_json", "string"), ("stage_hash", "string"), ("stage_name", "string"),
    ("role", "string"), ("finished_at", "timestamp"), ("backend", "string"), ("name", "string"),
    ("value", "float64"), ("unit", "string"), ("step", "int64"), ("context_len", "int64"),
    ("depth", "float64"), ("task", "string"), ("split", "string"), ("n", "int64"), ("stderr", "float64"),
]
_STAGE_FIELDS = [
    ("schema_version", "int16"), ("grid", "string"), ("stage_kind", "string"), ("stage_hash", "string"),
    ("name", "string"), ("state", "string"), ("failure_class", "string"), ("attempts", "int64"),
    ("created_at", "timestamp"), ("started_at", "timestamp"), ("finished_at", "timestamp"),
    ("gpu_seconds", "float64"), ("backend", "string"), ("mlflow_run_id", "string"),
    ("ray_run_name", "string"), ("storage_uri", "string"), ("config_json", "string"),
    ("cache_key_parts_json", "string"), ("node_id", "string"),   # Ray node of the latest attempt
    # what ran, as the stage's worker reported it (catalog.store.fingerprint.what_ran)
    ("attn_impl", "string"), ("deterministic", "bool"), ("precision", "string"), ("graph_mode", "string"),
    ("device", "string"),
]


def _schema(spec: list[tuple[str, str]]) -> Any:
    import pyarrow as pa

    types = {"int16": pa.int16(), "int64": pa.int64(), "float64": pa.float64(), "string": pa.string(),
             "bool": pa.bool_(), "timestamp": pa.timestamp("us", tz="UTC")}
    nullable = {"schema_version", "grid", "stage_kind", "stage_hash"}
    return pa.schema([pa.field(n, types[t], nullable=n not in nullable) for n, t in spec])


def metric_schema() -> Any:
    """The explicit pyarrow schema of the metrics dataset (before partitioning)."""
    return _schema(_METRIC_FIELDS)


def stage_schema() -> Any:
    return _schema(_STAGE_FIELDS)


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def metric_rows(store: CatalogStore, grid: str) -> list[dict[str, Any]]:
    rows = []
    for r in store.reads.metrics_frame(grid=grid):
        row = {name: r.get(name) for name, _ in _METRIC_FIELDS}
        row.update(schema_version=SCHEMA_VERSION, axes_json=_canonical(r["axes"]))
        rows.append(row)
    return rows


def stage_rows(store: CatalogStore, grid_id: int, grid: str) -> list[dict[str, Any]]:
    rows = []
    for s in store.stages_for_grid(grid_id, current_only=True):
        ran = what_ran(s.env)
        row = {name: getattr(s, name, ran.get(name)) for name, _ in _STAGE_FIELDS}
        row.update(schema_version=SCHEMA_VERSION, grid=grid, stage_kind=s.kind,
                   config_json=_canonical(s.config), cache_key_parts_json=_canonical(s.cache_key_parts))
        rows.append(row)
    return rows


def provenance(store: CatalogStore, grid: dict[str, Any], now: datetime | None = None) -> dict[str, str]:
    sha, dirty = git_state()
    return {"phaselab.schema_version": str(SCHEMA_VERSION), "phaselab.grid": grid["name"],
            "phaselab.grid_hash": grid["grid_hash"],
            "phaselab.grid_version": str(next((v["version"] for v in grid["versions"]
                                               if v["grid_hash"] == grid["grid_hash"]), "")),
            "phaselab.export_time": (now or datetime.now(UTC)).isoformat(),
            "phaselab.alembic_revision": store.revision() or "",
            "phaselab.git_sha": (sha or "") + ("+dirty" if dirty else "")}


def _write(rows: list[dict[str, Any]], schema: Any, base_dir: Path, fmt: str, meta: dict[str, str]) -> None:
    import pyarrow as pa
    import pyarrow.dataset as ds

    table = pa.Table.from_pylist(rows, schema=schema.with_metadata(meta))
    part = ds.partitioning(pa.schema([schema.field(c) for c in PARTITION_COLUMNS]), flavor="hive")
    ds.write_dataset(table, base_dir, format=fmt, partitioning=part,
                     existing_data_behavior="delete_matching", basename_template=f"part-{{i}}.{fmt}")


def export_grid(store: CatalogStore, grid: str, fmt: str, out_dir: Path, *,
                now: datetime | None = None) -> dict[str, Any]:
    """Export one grid (see the module docstring). Returns the provenance dict plus row counts.
    Raises ValueError for an unknown format or grid."""
    if fmt not in FORMATS:
        raise ValueError(f"export format must be one of {FORMATS}, got {fmt!r}")
    info = store.reads.get_grid(grid)
    if info is None:
        raise ValueError(f"grid {grid!r} is not in the catalog")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = provenance(store, info, now)
    metrics, stages = metric_rows(store, grid), stage_rows(store, info["id"], grid)
    _write(metrics, metric_schema(), out_dir / "metrics", fmt, meta)
    _write(stages, stage_schema(), out_dir / "stages", fmt, meta)
    summary = {**meta, "metric_rows": len(metrics), "stage_rows": len(stages), "format": fmt}
    (out_dir / f"_export_{grid}.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary


def read_metrics(out_dir: Path, fmt: str = "parquet", *, grid: str | None = None) -> Any:
    """Read an export back as a pyarrow Table with the partition columns restored as strings."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.dataset as ds

    schema = metric_schema()
    part = ds.partitioning(pa.schema([schema.field(c) for c in PARTITION_COLUMNS]), flavor="hive")
    if fmt == "csv":
        # CSV carries no types: read with the explicit schema (partition columns come from the
        # paths). pyarrow writes null unquoted and "" quoted, so both survive the round trip.
        data_cols = [f for f in schema if f.name not in PARTITION_COLUMNS]
        fmt_obj = ds.CsvFileFormat(convert_options=pacsv.ConvertOptions(
            column_types={f.name: f.type for f in data_cols}, strings_can_be_null=True,
            quoted_strings_can_be_null=False))
        dataset = ds.dataset(Path(out_dir) / "metrics", format=fmt_obj, partitioning=part, schema=schema)
    elif fmt == "parquet":
        dataset = ds.dataset(Path(out_dir) / "metrics", format="parquet", partitioning=part)
    else:
        raise ValueError(f"export format must be one of {FORMATS}, got {fmt!r}")
    flt = None if grid is None else ds.field("grid") == grid
    return dataset.to_table(filter=flt)
