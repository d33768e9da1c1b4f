"""The catalog's queries (plan, status, lineage, tables, export, ``tables --check-stale``):
:class:`CatalogQueries`, reached as ``CatalogStore.reads``; the writes and the stage state
machine are :class:`~phaselab.catalog.store.api.CatalogStore`'s own."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import fields
from typing import Any

from sqlalchemy import Connection, Engine, or_, select

from phaselab.catalog.store.rows import ArtifactSpec
from phaselab.catalog.store.schema import (
    Artifact,
    Attempt,
    Cell,
    CellStage,
    Grid,
    GridVersion,
    Metric,
    Stage,
    StageEdge,
    TableBuild,
)
from phaselab.catalog.tracking import MetricRecord


def current_version_clause() -> Any:
    """SQL condition: the cell_stage row belongs to its grid's current version (rows linked
    before migration 0002 have no version and count as current)."""
    current = (select(GridVersion.version)
               .where(GridVersion.grid_id == Cell.grid_id, GridVersion.grid_hash == Grid.grid_hash)
               .correlate(Cell, Grid).scalar_subquery())
    return or_(CellStage.grid_version.is_(None), CellStage.grid_version == current)


def pick_version(grid: Mapping[str, Any], version: int | None = None) -> dict[str, Any]:
    """The version row ``version`` of a ``get_grid`` result, or by default the grid's current
    one: the version whose hash the grid row holds, i.e. the one last run or submitted (an
    older version re-run after a newer one is current again). LookupError if there is none."""
    versions = list(grid.get("versions") or [])
    if version is not None:
        found = [v for v in versions if v["version"] == version]
        if not found:
            have = ", ".join(str(v["version"]) for v in versions) or "none"
            raise LookupError(f"grid {grid.get('name')!r} has no version {version} (versions: {have})")
        return dict(found[0])
    current = [v for v in versions if v["grid_hash"] == grid.get("grid_hash")]
    if not current and not versions:
        raise LookupError(f"grid {grid.get('name')!r} has no submitted version")
    return dict((current or versions)[-1])


class CatalogQueries:
    """Read-only queries over one engine (each in its own transaction)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        with self.engine.begin() as conn:
            yield conn

    def get_grid(self, name: str) -> dict[str, Any] | None:
        with self._tx() as conn:
            m = conn.execute(select(Grid.__table__).where(Grid.name == name)).mappings().first()
            if m is None:
                return None
            versions = conn.execute(select(GridVersion.__table__).where(GridVersion.grid_id == m["id"])
                                    .order_by(GridVersion.version)).mappings().all()
        return {**m, "versions": [dict(v) for v in versions]}

    def cells_for_grid(self, grid_id: int) -> list[dict[str, Any]]:
        with self._tx() as conn:
            return [dict(m) for m in conn.execute(select(Cell.__table__).where(Cell.grid_id == grid_id)
                                                  .order_by(Cell.id)).mappings()]

    def get_cell(self, cell_id: int) -> dict[str, Any] | None:
        """One cell with its grid's id and name."""
        q = (select(Cell.id.label("cell_id"), Cell.cell_key, Cell.axes, Cell.mlflow_run_id,
                    Grid.id.label("grid_id"), Grid.name.label("grid"))
             .join(Grid, Grid.id == Cell.grid_id).where(Cell.id == cell_id))
        with self._tx() as conn:
            m = conn.execute(q).mappings().first()
        return None if m is None else dict(m)

    def cells_for_stage(self, stage_hash: str) -> list[dict[str, Any]]:
        """The cells (with grid name, role and axes) a stage belongs to."""
        q = (select(Cell.id.label("cell_id"), Cell.cell_key, Cell.axes, Cell.mlflow_run_id,
                    CellStage.role, Grid.id.label("grid_id"), Grid.name.label("grid"))
             .join(CellStage, CellStage.cell_id == Cell.id).join(Grid, Grid.id == Cell.grid_id)
             .where(CellStage.stage_hash == stage_hash).order_by(Cell.id))
        with self._tx() as conn:
            return [dict(m) for m in conn.execute(q).mappings()]

    def edges(self, stage_hash: str | None = None) -> list[tuple[str, str, str]]:
        """(upstream, downstream, relation) edges, all or those touching ``stage_hash``."""
        q = select(StageEdge.upstream, StageEdge.downstream, StageEdge.relation)
        if stage_hash is not None:
            q = q.where(or_(StageEdge.upstream == stage_hash, StageEdge.downstream == stage_hash))
        with self._tx() as conn:
            return [tuple(r) for r in conn.execute(q.order_by(StageEdge.upstream, StageEdge.downstream))]

    def metrics_for_stage(self, stage_hash: str) -> list[MetricRecord]:
        cols = [f.name for f in fields(MetricRecord)]
        with self._tx() as conn:
            rows = conn.execute(select(*(getattr(Metric, c) for c in cols))
                                .where(Metric.stage_hash == stage_hash).order_by(Metric.id)).mappings()
            return [MetricRecord(**dict(r)) for r in rows]

    def artifacts_for_stage(self, stage_hash: str) -> list[ArtifactSpec]:
        with self._tx() as conn:
            rows = conn.execute(select(Artifact.name, Artifact.uri, Artifact.sha256, Artifact.bytes,
                                       Artifact.kind).where(Artifact.produced_by == stage_hash)
                                .order_by(Artifact.name)).mappings()
            return [ArtifactSpec(**dict(r)) for r in rows]

    def stage_states(self, stage_hashes: list[str]) -> dict[str, str]:
        """stage hash -> state for those of ``stage_hashes`` in the catalog (a read, in chunks of
        500 bound parameters: SQLite's limit on variables is 32766, older builds 999)."""
        out: dict[str, str] = {}
        hashes = list(stage_hashes)
        with self._tx() as conn:
            for i in range(0, len(hashes), 500):
                q = select(Stage.stage_hash, Stage.state).where(Stage.stage_hash.in_(hashes[i:i + 500]))
                out.update({h: state for h, state in conn.execute(q)})
        return out

    def final_metrics(self, stage_hashes: list[str], prefix: str) -> dict[str, dict[str, float]]:
        """stage hash -> {name: value} of the stages' run-level metrics (no step, context length,
        task or split) whose name starts with ``prefix`` (``"time/"``: where a training stage's
        time went), for those of ``stage_hashes`` that have any; read in chunks of 500."""
        out: dict[str, dict[str, float]] = {}
        hashes = list(stage_hashes)
        with self._tx() as conn:
            for i in range(0, len(hashes), 500):
                q = (select(Metric.stage_hash, Metric.name, Metric.value)
                     .where(Metric.stage_hash.in_(hashes[i:i + 500]), Metric.name.startswith(prefix, autoescape=True),
                            Metric.step.is_(None), Metric.context_len.is_(None), Metric.task.is_(None),
                            Metric.split.is_(None)).order_by(Metric.id))
                for h, name, value in conn.execute(q):
                    out.setdefault(h, {})[name] = value
        return out

    def attempts_for_stage(self, stage_hash: str) -> list[dict[str, Any]]:
        with self._tx() as conn:
            return [dict(m) for m in conn.execute(select(Attempt.__table__).where(
                Attempt.stage_hash == stage_hash).order_by(Attempt.attempt_no)).mappings()]

    def attempt_nodes(self, stage_hashes: list[str]) -> dict[str, list[tuple[int, str | None]]]:
        """stage hash -> [(attempt number, Ray node id or None)] in attempt order, for the
        given stages (those without attempt rows are left out)."""
        out: dict[str, list[tuple[int, str | None]]] = {}
        if not stage_hashes:
            return out
        q = (select(Attempt.stage_hash, Attempt.attempt_no, Attempt.node_id)
             .where(Attempt.stage_hash.in_(list(stage_hashes))).order_by(Attempt.stage_hash, Attempt.attempt_no))
        with self._tx() as conn:
            for h, n, node in conn.execute(q):
                out.setdefault(h, []).append((n, node))
        return out

    def metrics_frame(self, *, grid: str | None = None, succeeded_only: bool = True,
                      current_only: bool = True) -> list[dict[str, Any]]:
        """Long-format rows, one per (metric, cell the stage belongs to), with the cell's axes
        (``axes`` dict) and the stage's kind/name/role/state/finish time and the grid version
        that linked it. ``current_only``: only stages of each grid's current version (the one
        of its latest submission; stages superseded by a code/config change drop out). Usable as
        ``pandas.DataFrame(rows)``; ordered by grid, cell, stage, metric id."""
        q = (select(Grid.name.label("grid"), Grid.id.label("grid_id"), Cell.id.label("cell_id"),
                    Cell.cell_key, Cell.axes, Stage.stage_hash, Stage.kind.label("stage_kind"),
                    Stage.name.label("stage_name"), CellStage.role, Stage.state, Stage.attempts,
                    Stage.finished_at, Stage.backend, Metric.name, Metric.value, Metric.unit,
                    Metric.step, Metric.context_len, Metric.depth, Metric.task, Metric.split,
                    Metric.n, Metric.stderr, CellStage.grid_version)
             .select_from(Metric)
             .join(Stage, Stage.stage_hash == Metric.stage_hash)
             .join(CellStage, CellStage.stage_hash == Stage.stage_hash)
             .join(Cell, Cell.id == CellStage.cell_id)
             .join(Grid, Grid.id == Cell.grid_id))
        if grid is not None:
            q = q.where(Grid.name == grid)
        if succeeded_only:
            q = q.where(Stage.state == "SUCCEEDED")
        if current_only:
            q = q.where(current_version_clause())
        q = q.order_by(Grid.name, Cell.id, Stage.stage_hash, Metric.id)
        with self._tx() as conn:
            return [dict(m) for m in conn.execute(q).mappings()]

    # -- table builds (phaselab tables --check-stale) -----------------------------------------
    def latest_table_build(self, table_name: str) -> dict[str, Any] | None:
        with self._tx() as conn:
            m = conn.execute(select(TableBuild.__table__).where(TableBuild.table_name == table_name)
                             .order_by(TableBuild.id.desc()).limit(1)).mappings().first()
        return None if m is None else dict(m)
