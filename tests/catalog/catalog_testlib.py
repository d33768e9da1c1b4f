"""Builders shared by the catalog tests (hand-built catalogs with known contents)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from phaselab.catalog.store.api import CatalogStore, StageSpec
from phaselab.catalog.tracking import MetricRecord


def h(label: str) -> str:
    """A deterministic 64-hex stage hash for a readable label."""
    return hashlib.sha256(label.encode()).hexdigest()


def add_stage(store: CatalogStore, cell_id: int, label: str, *, kind: str = "eval",
              role: str | None = None, config: Mapping[str, Any] | None = None) -> str:
    stage_hash = h(label)
    store.upsert_stage(StageSpec(stage_hash=stage_hash, kind=kind, name=label,
                                 config=dict(config or {"label": label}),
                                 cache_key_parts={"kind": kind, "config": {"label": label}}))
    store.link_cell_stage(cell_id, stage_hash, role=role or kind)
    return stage_hash


def run_stage(store: CatalogStore, stage_hash: str, metrics: list[MetricRecord], *,
              backend: str = "sdpa") -> None:
    """PLANNED/READY -> RUNNING -> SUCCEEDED with ``metrics`` (the controller's path)."""
    store.transition(stage_hash, "READY", expected={"PLANNED", "FAILED", "SUCCEEDED"})
    assert store.claim(stage_hash, "test-controller")
    store.finalize_success(stage_hash, metrics=metrics, artifacts=[], env={"git_sha": "0" * 40},
                           backend=backend, mlflow_run_id=None)


def cell(store: CatalogStore, grid_id: int, axes: Mapping[str, Any]) -> int:
    key = ",".join(f"{k}={axes[k]}" for k in sorted(axes))
    return store.upsert_cell(grid_id=grid_id, cell_key=key, axes=dict(axes))
