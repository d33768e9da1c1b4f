"""The controller's MLflow side (DESIGN §5.5): the grid's experiment prepared before any stage
launches, the arguments each stage's worker needs to open or reattach its run, and the stage runs
the controller ends itself (those of killed or lost workers). MLflow is a view: a failure here is
logged, never raised into the controller loop.

The controller owns one :class:`MlflowRuns` (``Controller.runs``) once its grid is in the catalog.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from phaselab.orchestrator.plan.dag import Dag, StageNode

log = logging.getLogger(__name__)


class MlflowRuns:
    """A grid's MLflow runs: ``mlflow`` is the tracking settings (``tracking_uri``,
    ``artifact_root``) or None when tracking is off, and then every method does nothing."""

    def __init__(self, mlflow: Mapping[str, Any] | None, *, dag: Dag, store: Any, grid_id: int | None,
                 runs_root: Path) -> None:
        self.mlflow = dict(mlflow) if mlflow else None
        self.dag, self.store, self.grid_id, self.runs_root = dag, store, grid_id, runs_root
        self._cell_ids: dict[str, int] = {}

    def stage_args(self, node: StageNode) -> dict[str, Any] | None:
        """Arguments of ``MlflowTracker.for_stage`` for the node's first cell (DESIGN §5.5)."""
        if not self.mlflow:
            return None
        from phaselab.catalog.tracking.mlflow_common import common_axes

        cell_key = node.members[0][0]
        row = self.store.get_stage(node.hash)
        return {"tracking_uri": self.mlflow["tracking_uri"], "artifact_root": self.mlflow.get("artifact_root"),
                "grid": self.dag.spec.grid, "grid_id": self.grid_id, "cell_id": self._cell_ids[cell_key],
                "cell_key": cell_key, "stage_hash": node.hash, "stage_kind": node.kind,
                "spool_dir": str(self.runs_root / "_mlflow_spool"),
                "axes": dict(next(c.axes for c in self.dag.cells if c.key == cell_key)),
                "upstream": list(node.upstream.values()),
                "run_id": row.mlflow_run_id if row is not None else None,
                "stage_name": node.name, "runs_root": str(self.runs_root),
                "stage_axes": common_axes(c.axes for c in self.dag.cells if c.key in {k for k, _ in node.members})}

    def prepare(self) -> None:
        """Replay earlier runs' spooled tracker calls, then create and describe the grid's
        experiment here, once, so Ray workers only open their stage runs. An unreachable tracker
        costs one short probe: the stages' trackers then spool."""
        self._cell_ids = {c["cell_key"]: c["id"] for c in self.store.reads.cells_for_grid(self.grid_id)}
        if not self.mlflow:
            return
        from phaselab.catalog.tracking.mlflow_experiment import prepare_experiment
        from phaselab.catalog.tracking.mlflow_tracker import replay_spools

        uri = self.mlflow["tracking_uri"]
        replay_spools(self.runs_root / "_mlflow_spool", uri)
        prepare_experiment(uri, self.dag.spec.grid, [{"axes": dict(c.axes)} for c in self.dag.cells],
                           artifact_root=self.mlflow.get("artifact_root"), description=self.dag.spec.description)

    def end_stage_run(self, h: str, status: str) -> None:
        """End a stage's MLflow run with ``status`` when its worker could not (killed, hung,
        lost): the run would stay RUNNING forever. Spooled like any call while MLflow is down."""
        if not self.mlflow:
            return
        from phaselab.catalog.tracking.mlflow_tracker import MlflowTracker

        try:
            cfg = self.stage_args(self.dag.nodes[h])
            MlflowTracker.for_stage(**{**cfg, "spool_dir": Path(cfg["spool_dir"])}).end(status)
        except Exception as exc:  # noqa: BLE001 - the tracker is a view; the catalog has the failure
            log.warning("cannot end the MLflow run of %s: %s", h[:12], exc)
