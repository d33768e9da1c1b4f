"""Lineage: catalog rows ↔ MLflow runs (DESIGN §5.5); walks over the stage DAG are in
``phaselab.catalog.store.walks``.

The catalog is the source of truth; MLflow mirrors it for browsing. A stage's run id is stored
on the ``stage`` row, so a resumed stage reattaches to its run (never a second run with re-logged
params).

Typical use::

    tracker = lineage.stage_tracker(store, stage_hash, tracking_uri=uri, spool_dir=d)   # rank 0
    ... run the stage with tracker ...
    store.finalize_success(..., mlflow_run_id=tracker.run_id)
"""

from __future__ import annotations

from pathlib import Path

from phaselab.catalog.store.api import CatalogStore
from phaselab.catalog.tracking.mlflow_tracker import MlflowTracker


def stage_tracker(store: CatalogStore, stage_hash: str, *, tracking_uri: str, spool_dir: Path,
                  cell_id: int | None = None, attn_backend: str | None = None, git_commit: str | None = None,
                  artifact_root: str | None = None, rank: int | None = None) -> MlflowTracker:
    """An :class:`MlflowTracker` for a stage, filled from the catalog: its grid and cell (the
    first one if the stage is shared and ``cell_id`` is None), its upstream hashes, and its stored
    run id when it resumes."""
    stage = store.get_stage(stage_hash)
    if stage is None:
        raise KeyError(f"no stage {stage_hash!r}")
    cells = store.reads.cells_for_stage(stage_hash)
    if cell_id is not None:
        cells = [c for c in cells if c["cell_id"] == cell_id]
    if not cells:
        raise ValueError(f"stage {stage_hash} belongs to no cell{'' if cell_id is None else f' {cell_id}'}")
    cell = cells[0]
    upstream = sorted(u for u, d, _ in store.reads.edges(stage_hash) if d == stage_hash)
    return MlflowTracker.for_stage(
        tracking_uri=tracking_uri, grid=cell["grid"], grid_id=cell["grid_id"], cell_id=cell["cell_id"],
        cell_key=cell["cell_key"], axes=cell["axes"], stage_hash=stage_hash, stage_kind=stage.kind,
        upstream=upstream, attn_backend=attn_backend or stage.backend, git_commit=git_commit,
        run_id=stage.mlflow_run_id,
        stage_name=stage.name, artifact_root=artifact_root, spool_dir=spool_dir, rank=rank)
