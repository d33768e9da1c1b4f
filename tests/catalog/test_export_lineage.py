"""Parquet/CSV export round trip with schema metadata (DESIGN §5.10) and lineage walks."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from catalog_testlib import add_stage, cell, run_stage

from phaselab.catalog.reports import export
from phaselab.catalog.store import walks
from phaselab.catalog.store.api import CatalogStore
from phaselab.catalog.tracking import MetricRecord

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def _demo(store: CatalogStore) -> dict[str, str]:
    gid = store.upsert_grid(name="demo", grid_hash="g" * 64, yaml_submitted="", yaml_resolved="")
    rope, pope = cell(store, gid, {"pe": "rope", "seed": 0}), cell(store, gid, {"pe": "pope", "seed": 0})
    pre = add_stage(store, rope, "pre-rope", kind="pretrain")
    ft = add_stage(store, rope, "ft-rope", kind="finetune")
    ev = add_stage(store, rope, "ev-rope")
    ev_p = add_stage(store, pope, "ev-pope")
    store.add_edge(pre, ft, "finetunes")
    store.add_edge(ft, ev, "evaluates")
    run_stage(store, pre, [MetricRecord(name="loss", value=1.25, step=100, split="train")])
    run_stage(store, ev, [MetricRecord(name="ppl", value=12.5, unit="ppl", context_len=c, n=4096)
                          for c in (256, 512)] + [MetricRecord(name="acc", value=0.5, task="blimp")])
    run_stage(store, ev_p, [MetricRecord(name="ppl", value=11.0, unit="ppl", context_len=256,
                                         stderr=0.25)])
    return {"pre": pre, "ft": ft, "ev": ev, "ev_p": ev_p}


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_export_round_trip(store: CatalogStore, tmp_path: Path, fmt: str) -> None:
    import pyarrow.parquet as pq

    _demo(store)
    out = tmp_path / "export"
    summary = export.export_grid(store, "demo", fmt, out, now=NOW)
    export.export_grid(store, "demo", fmt, out, now=NOW)      # re-export replaces, never appends
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob(f"*.{fmt}"))
    assert files == [f"{d}/grid=demo/stage_kind={k}/part-0.{fmt}"
                     for d in ("metrics", "stages") for k in ("eval", "finetune", "pretrain")
                     if not (d == "metrics" and k == "finetune")]
    assert summary["metric_rows"] == 5 and summary["stage_rows"] == 4
    assert summary["phaselab.alembic_revision"] == "0003" and summary["phaselab.grid_version"] == "1"
    assert summary["phaselab.export_time"] == NOW.isoformat()
    assert json.loads((out / "_export_demo.json").read_text())["phaselab.grid_hash"] == "g" * 64

    table = export.read_metrics(out, fmt, grid="demo")
    got = sorted((r["stage_kind"], r["name"], r["context_len"], r["task"], r["value"], r["stderr"],
                  r["unit"], json.loads(r["axes_json"])["pe"], r["schema_version"])
                 for r in table.to_pylist())
    want = sorted((r["stage_kind"], r["name"], r["context_len"], r["task"], r["value"], r["stderr"],
                   r["unit"], r["axes"]["pe"], export.SCHEMA_VERSION)
                  for r in store.reads.metrics_frame(grid="demo"))
    assert got == want and len(got) == 5
    if fmt == "parquet":
        part = next(out.glob("metrics/grid=demo/stage_kind=eval/*.parquet"))
        meta = pq.read_schema(part).metadata
        assert meta[b"phaselab.grid_hash"] == b"g" * 64 and meta[b"phaselab.alembic_revision"] == b"0003"
        assert meta[b"phaselab.export_time"] == NOW.isoformat().encode()
        assert pq.read_schema(part).field("value").type == "double"


def test_export_rejects_unknown_grid_and_format(store: CatalogStore, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not in the catalog"):
        export.export_grid(store, "nope", "parquet", tmp_path)
    with pytest.raises(ValueError, match="format"):
        export.export_grid(store, "nope", "xlsx", tmp_path)


def test_lineage_walks(store: CatalogStore) -> None:
    s = _demo(store)
    assert walks.ancestors(store, s["ev"]) == [(s["ft"], "evaluates", 1), (s["pre"], "finetunes", 2)]
    assert walks.descendants(store, s["pre"]) == [(s["ft"], "finetunes", 1), (s["ev"], "evaluates", 2)]
    assert walks.ancestors(store, s["ev_p"]) == []
