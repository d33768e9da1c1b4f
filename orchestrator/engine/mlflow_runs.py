"""The controller's MLflow side (DESIGN §5.5): one parent run per cell created before any stage
launches, the arguments each stage's worker needs to attach its child run, and the runs the
controller ends itself (parent runs when the grid is done, stage runs of killed or lost
workers). MLflow is a view: a failure here is logged, never raised into the controller loop.

The controller owns one :class:`MlflowRuns` (``Controller.runs``) once its grid is in the catalog.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from phaselab.orchestrator.plan.dag import Dag, StageNode


class MlflowRuns:
    """A grid's MLflow runs: ``mlflow`` is the tracking settings (``tracking_uri``,
    ``artifact_root``) or None when tracking is off, and then every method does nothing."""

    def __init__(self, mlflow: Mapping[str, Any] | None, *, dag: Dag, store: Any, grid_id: int | None,
                 runs_root: Path) -> None:
        self.mlflow = dict(mlflow) if mlflow else None
        self.dag, self.store, self.grid_id, self.runs_root = dag, store, grid_id, runs_root
        self._cell_runs: dict[str, tuple[int, str | None]] = {}

    def stage_args(self, node: StageNode) -> dict[str, Any] | None:
        """Arguments of ``MlflowTracker.for_stage`` for the node's first cell (DESIGN §5.5)."""
        if not self.mlflow:
            return None
        from phaselab.catalog.tracking.mlflow_common import common_axes

        cell_key = node.members[0][0]
        cell_id, parent = self._cell_runs[cell_key]
        row = self.store.get_stage(node.hash)
        return {"tracking_uri": self.mlflow["tracking_uri"], "artifact_root": self.mlflow.get("artifact_root"),
                "grid": self.dag.spec.grid, "grid_id": self.grid_id, "cell_id": cell_id, "cell_key": cell_key,
                "stage_hash": node.hash, "stage_kind": node.kind, "spool_dir": str(self.runs_root / "_mlflow_spool"),
                "axes": dict(next(c.axes for c in self.dag.cells if c.key == cell_key)),
                "upstream": list(node.upstream.values()), "parent_run_id": parent,
                "run_id": row.mlflow_run_id if row is not None else None,
                "stage_name": node.name, "runs_root": str(self.runs_root),
                "stage_axes": common_axes(c.axes for c in self.dag.cells if c.key in {k for k, _ in node.members})}

    def prepare(self) -> None:
        """Replay earlier runs' spooled tracker calls, then create the grid's experiment and one
        parent run per cell here, once, so Ray workers only attach child runs (no concurrent
        store migrations or parent-run races). An unreachable tracker costs one short probe:
        the cells then have no parent run yet and their stages' spools create it later."""
        self._cell_runs = {}
        cells = {c["cell_key"]: c for c in self.store.reads.cells_for_grid(self.grid_id)}
        if not self.mlflow:
            return
        from phaselab.catalog.tracking.mlflow_tracker import prepare_cell_runs, replay_spools

        uri = self.mlflow["tracking_uri"]
        replay_spools(self.runs_root / "_mlflow_spool", uri)
        runs = prepare_cell_runs(uri, self.dag.spec.grid, [
            {"cell_key": c.key, "cell_id": cells[c.key]["id"], "grid_id": self.grid_id,
             "axes": dict(c.axes), "run_id": cells[c.key].get("mlflow_run_id")} for c in self.dag.cells],
            artifact_root=self.mlflow.get("artifact_root"), description=self.dag.spec.description)
        for cell in self.dag.cells:
            cid, run_id = cells[cell.key]["id"], runs.get(cell.key)
            self._cell_runs[cell.key] = (cid, self.store.set_cell_mlflow_run(cid, run_id) if run_id else None)

    def end_cells(self, rows: Mapping[str, Any]) -> None:
        """A cell's parent MLflow run ends FINISHED when all its stages succeeded, else FAILED
        (called when no stage of the grid is pending any more)."""
        if not self.mlflow or not self._cell_runs:
            return
        from phaselab.catalog.tracking.mlflow_tracker import end_cell_runs

        ok: dict[str, bool] = {}
        for h, node in self.dag.nodes.items():
            for cell_key, _ in node.members:
                ok[cell_key] = ok.get(cell_key, True) and rows[h].state == "SUCCEEDED"
        end_cell_runs(self.mlflow["tracking_uri"], {
            run: "FINISHED" if ok.get(key, True) else "FAILED"
            for key, (_, run) in self._cell_runs.items() if run is not None})

    def end_stage_run(self, h: str, status: str) -> None:
        """End a stage's MLflow run with ``status`` when its worker could not (killed, hung,
        lost): the run would stay RUNNING forever. Spooled like any call while MLflow is down."""
        if not self.mlflow or not self._cell_runs:
            return
        from phaselab.catalog.tracking.mlflow_tracker import MlflowTracker

        try:
            cfg = self.stage_args(self.dag.nodes[h])
            MlflowTracker.for_stage(**{**cfg, "spool_dir": Path(cfg["spool_dir"])}).end(status)
        except Exception as exc:  # noqa: BLE001 - the tracker is a view; the catalog has the failure
            import logging

            logging.getLogger(__name__).warning("cannot end the MLflow run of %s: %s", h[:12], exc)
