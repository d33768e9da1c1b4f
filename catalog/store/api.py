"""``CatalogStore``: the one API through which the orchestrator reads and writes the catalog.

State machine (DESIGN §5.1): ``PLANNED → READY → RUNNING → SUCCEEDED | FAILED(class) | CANCELLED |
BLOCKED``. Every state change is a compare-and-set (``UPDATE … WHERE state IN expected``), so two
controllers can never both move a stage. A stage becomes SUCCEEDED only in
:meth:`CatalogStore.finalize_success`, in the same transaction that commits its metrics, artifact
digests and environment fingerprint (the success rule).

Idempotency: every insert is ``ON CONFLICT DO NOTHING`` (stage, cell, grid, edge, membership) or
``ON CONFLICT DO UPDATE`` (metric, artifact, attempt, eval_meta) on a natural key, so a retried
report never duplicates rows. Metrics are keyed by ``schema.metric_ident`` (name, task, split,
context length, depth, step).

Methods (the orchestrator's contract, then additions):

======================================  ===========================================================
``upgrade()``                           ``alembic upgrade head`` (controller / init job only)
``upsert_grid(...) -> int``             grid id; a new ``grid_version`` per new grid hash
``upsert_cell(...) -> int``             cell id; ValueError if the key exists with other axes
``upsert_stage(StageSpec) -> bool``     True if inserted, False if the hash existed
``link_cell_stage(cell, hash, role=)``  idempotent membership (role: the stage's name in the cell)
``add_edge(up, down, relation)``        idempotent lineage edge
``get_stage / stages_for_grid``         :class:`StageRow` snapshots
``transition(hash, to, expected=)``     compare-and-set; SUCCEEDED only via finalize_success
``claim(hash, owner) -> bool``          READY → RUNNING, attempts + 1 and its ``attempt`` row
                                        (SKIP LOCKED on Postgres)
``heartbeat / stale_running``           liveness of RUNNING stages
``finalize_success(...)``               one transaction; re-finalising does not duplicate rows
``record_failure / record_attempt``     FAILED with a class; env fingerprint per attempt
``record_attempt_start(hash, n, node)``  the Ray node attempt ``n`` runs on (written by its worker)
``claim_ready(owner, limit=, ...)``     claim up to ``limit`` READY stages (batch form of claim)
``update_stage_info(hash, ...)``        ray run name, storage URI, MLflow run id, GPU-seconds
``record_eval_meta(hash, task, ...)``   lm-eval task version + config (EXPERIMENTS §2.5)
``record_table_build(...)``             for ``phaselab tables --check-stale``
``revision()``                          the Alembic revision of the database
``reads``                               :class:`~phaselab.catalog.store.queries.CatalogQueries`:
                                        get_grid / get_cell / cells_for_grid / cells_for_stage /
                                        edges / metrics_for_stage / artifacts_for_stage /
                                        attempts_for_stage / attempt_nodes / stage_states /
                                        metrics_frame / latest_table_build
======================================  ===========================================================

The value types (:class:`StageSpec`, :class:`ArtifactSpec`, :class:`StageRow`,
:class:`StateError`) live in ``catalog.store.rows`` and are importable from here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, Self

from sqlalchemy import Connection, and_, func, select, update

from phaselab.catalog.store import db
from phaselab.catalog.store.queries import CatalogQueries, current_version_clause
from phaselab.catalog.store.rows import (  # noqa: F401  (re-exported: the orchestrator imports them from here)
    ArtifactSpec,
    StageRow,
    StageSpec,
    StateError,
    check_hash,
    check_state,
)
from phaselab.catalog.store.schema import (
    RELATIONS,
    Artifact,
    Attempt,
    Cell,
    CellStage,
    EvalMeta,
    Grid,
    GridVersion,
    Metric,
    Stage,
    StageEdge,
    TableBuild,
    metric_ident,
    utcnow,
)
from phaselab.catalog.tracking import MetricRecord

TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
# A success report is a fact about committed artifacts: it is accepted from RUNNING, again from
# SUCCEEDED (idempotent retry), and from FAILED (a late report after a heartbeat timeout).
FINALIZABLE = frozenset({"RUNNING", "SUCCEEDED", "FAILED"})

class CatalogStore:
    """See the module docstring. ``url`` None → ``PHASELAB_CATALOG_URL`` or the SQLite default."""

    def __init__(self, url: str | None = None) -> None:
        self.url = db.normalize_url(db.default_url() if url is None else url)
        self.engine = db.make_engine(self.url)
        self.dialect = self.engine.dialect.name
        self.reads = CatalogQueries(self.engine)

    # -- plumbing -----------------------------------------------------------------------------
    def dispose(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.dispose()

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        with self.engine.begin() as conn:
            yield conn

    def _insert(self, model: type) -> Any:
        if self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert
        return insert(model.__table__)

    def upgrade(self) -> None:
        """Migrate to head, after proving a SQLite catalog's folder takes writes (a read-only or
        full one raises :class:`db.StorageFault` before any work starts)."""
        path = db.sqlite_path(self.url)
        if path is not None:
            db.check_writable(path.parent, what="catalog folder", fix=db.CATALOG_FIX)
        db.upgrade(self.engine)

    def revision(self) -> str | None:
        return db.current_revision(self.engine)

    # -- grids, cells, stages -----------------------------------------------------------------
    def upsert_grid(self, *, name: str, grid_hash: str, yaml_submitted: str, yaml_resolved: str) -> int:
        if not name or not grid_hash:
            raise ValueError(f"grid needs a name and a hash, got name={name!r} hash={grid_hash!r}")
        now = utcnow()
        with self._tx() as conn:
            conn.execute(self._insert(Grid).values(name=name, grid_hash=grid_hash, created_at=now,
                                                   updated_at=now).on_conflict_do_nothing())
            # Lock the grid row so concurrent submissions number their versions one at a time.
            grid_id = conn.execute(select(Grid.id).where(Grid.name == name).with_for_update()).scalar_one()
            seen = conn.execute(select(GridVersion.id).where(GridVersion.grid_id == grid_id,
                                                             GridVersion.grid_hash == grid_hash)).first()
            if seen is None:
                last = conn.execute(select(func.max(GridVersion.version))
                                    .where(GridVersion.grid_id == grid_id)).scalar()
                conn.execute(self._insert(GridVersion).values(
                    grid_id=grid_id, version=(last or 0) + 1, grid_hash=grid_hash,
                    yaml_submitted=yaml_submitted, yaml_resolved=yaml_resolved, created_at=now))
            conn.execute(update(Grid).where(Grid.id == grid_id).values(grid_hash=grid_hash, updated_at=now))
        return grid_id

    def upsert_cell(self, *, grid_id: int, cell_key: str, axes: Mapping[str, Any]) -> int:
        if not cell_key:
            raise ValueError(f"cell_key must be a non-empty string, got {cell_key!r}")
        axes = dict(axes)
        with self._tx() as conn:
            conn.execute(self._insert(Cell).values(grid_id=grid_id, cell_key=cell_key, axes=axes,
                                                   created_at=utcnow()).on_conflict_do_nothing())
            cell_id, stored = conn.execute(select(Cell.id, Cell.axes).where(
                Cell.grid_id == grid_id, Cell.cell_key == cell_key)).one()
        if stored != axes:
            raise ValueError(f"cell {cell_key!r} of grid {grid_id} exists with axes {stored!r}, not {axes!r}")
        return cell_id

    def upsert_stage(self, row: StageSpec) -> bool:
        if not isinstance(row, StageSpec):
            raise TypeError(f"upsert_stage takes a StageSpec, got {type(row).__name__}")
        now = utcnow()
        values = {"stage_hash": row.stage_hash, "kind": row.kind, "name": row.name, "config": dict(row.config),
                      "cache_key_parts": dict(row.cache_key_parts), "state": row.state, "attempts": 0,
                      "created_at": now, "updated_at": now, "ray_run_name": row.ray_run_name,
                      "storage_uri": row.storage_uri}
        with self._tx() as conn:
            # RETURNING, not rowcount: drivers disagree on rowcount for a skipped ON CONFLICT row.
            inserted = conn.execute(self._insert(Stage).values(**values)
                                    .on_conflict_do_nothing(index_elements=["stage_hash"])
                                    .returning(Stage.stage_hash)).first()
        return inserted is not None

    def link_cell_stage(self, cell_id: int, stage_hash: str, *, role: str | None = None) -> None:
        """Idempotent membership; records the grid's current version (the one of its latest
        ``upsert_grid``) as the version that last linked the stage (see ``current_version``)."""
        with self._tx() as conn:
            version = conn.execute(
                select(GridVersion.version).join(Grid, and_(Grid.id == GridVersion.grid_id,
                                                            Grid.grid_hash == GridVersion.grid_hash))
                .join(Cell, Cell.grid_id == Grid.id).where(Cell.id == cell_id)).scalar()
            stmt = self._insert(CellStage).values(cell_id=cell_id, stage_hash=stage_hash, role=role,
                                                  grid_version=version)
            conn.execute(stmt.on_conflict_do_update(
                index_elements=["cell_id", "stage_hash"],
                set_={"role": stmt.excluded.role, "grid_version": stmt.excluded.grid_version}))

    def add_edge(self, upstream: str, downstream: str, relation: str) -> None:
        if relation not in RELATIONS:
            raise ValueError(f"unknown edge relation {relation!r}; expected one of {RELATIONS}")
        if upstream == downstream:
            raise ValueError(f"a stage cannot be its own upstream: {upstream!r}")
        with self._tx() as conn:
            conn.execute(self._insert(StageEdge).values(upstream=upstream, downstream=downstream,
                                                        relation=relation).on_conflict_do_nothing())

    def get_stage(self, stage_hash: str) -> StageRow | None:
        with self._tx() as conn:
            m = conn.execute(select(Stage.__table__).where(Stage.stage_hash == stage_hash)).mappings().first()
        return None if m is None else StageRow.from_mapping(m)

    def stages_for_grid(self, grid_id: int, *, current_only: bool = False) -> list[StageRow]:
        """Stages linked to the grid's cells (``current_only``: by its current version)."""
        members = select(CellStage.stage_hash).join(Cell, Cell.id == CellStage.cell_id) \
            .where(Cell.grid_id == grid_id)
        if current_only:
            members = members.join(Grid, Grid.id == Cell.grid_id).where(current_version_clause())
        q = select(Stage.__table__).where(Stage.stage_hash.in_(members)) \
            .order_by(Stage.created_at, Stage.stage_hash)
        with self._tx() as conn:
            return [StageRow.from_mapping(m) for m in conn.execute(q).mappings()]

    def stages_in_state(self, states: Iterable[str], *, grid_id: int | None = None) -> list[StageRow]:
        states = set(states)
        for s in states:
            check_state(s)
        q = select(Stage.__table__).where(Stage.state.in_(states))
        if grid_id is not None:
            q = q.where(Stage.stage_hash.in_(select(CellStage.stage_hash).join(
                Cell, Cell.id == CellStage.cell_id).where(Cell.grid_id == grid_id)))
        with self._tx() as conn:
            return [StageRow.from_mapping(m) for m in conn.execute(q.order_by(Stage.created_at))
                    .mappings()]

    # -- state machine ------------------------------------------------------------------------
    def transition(self, stage_hash: str, to_state: str, *, expected: set[str],
                   failure_class: str | None = None, message: str | None = None) -> bool:
        """Compare-and-set ``state``: moves to ``to_state`` only if the state is in ``expected``.
        Sets ``failure_class``/``message`` as given (None clears them, e.g. on a retry)."""
        check_state(to_state)
        if not expected:
            raise ValueError("transition needs a non-empty expected set of states")
        for s in expected:
            check_state(s)
        if to_state == "SUCCEEDED":
            raise StateError("a stage becomes SUCCEEDED only through finalize_success (DESIGN §5.1)")
        now = utcnow()
        values: dict[str, Any] = {"state": to_state, "updated_at": now, "failure_class": failure_class,
                                      "message": message}
        if to_state in TERMINAL:
            values["finished_at"] = now
        with self._tx() as conn:
            res = conn.execute(update(Stage).where(Stage.stage_hash == stage_hash,
                                                   Stage.state.in_(expected)).values(**values))
        return res.rowcount == 1

    def claim(self, stage_hash: str, owner: str) -> bool:
        return bool(self._claim(owner, select(Stage.stage_hash).where(Stage.stage_hash == stage_hash)))

    def claim_ready(self, owner: str, *, limit: int = 1, kinds: Iterable[str] | None = None,
                    grid_id: int | None = None) -> list[StageRow]:
        """Claim up to ``limit`` READY stages (oldest first); returns the claimed rows."""
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit!r}")
        q = select(Stage.stage_hash).order_by(Stage.created_at, Stage.stage_hash).limit(limit)
        if kinds is not None:
            q = q.where(Stage.kind.in_(list(kinds)))
        if grid_id is not None:
            q = q.where(Stage.stage_hash.in_(select(CellStage.stage_hash).join(
                Cell, Cell.id == CellStage.cell_id).where(Cell.grid_id == grid_id)))
        hashes = self._claim(owner, q)
        return [row for h in hashes if (row := self.get_stage(h)) is not None]

    def _claim(self, owner: str, candidates: Any) -> list[str]:
        if not owner:
            raise ValueError(f"claim needs a non-empty owner, got {owner!r}")
        now = utcnow()
        with self._tx() as conn:
            # SKIP LOCKED: a second controller passes over rows another one is claiming instead of
            # queueing behind it (Postgres; SQLite serialises writers with BEGIN IMMEDIATE).
            locked = conn.execute(candidates.where(Stage.state == "READY")
                                  .with_for_update(skip_locked=True)).scalars().all()
            won = []
            for h in locked:
                res = conn.execute(update(Stage).where(Stage.stage_hash == h, Stage.state == "READY")
                                   .values(state="RUNNING", attempts=Stage.attempts + 1, owner=owner,
                                           started_at=now, heartbeat_at=now, updated_at=now,
                                           finished_at=None, failure_class=None, message=None,
                                           node_id=None))   # the new attempt's worker sets it
                if res.rowcount == 1:
                    won.append(h)
                    self._open_attempt(conn, h, now)
        return won

    def _open_attempt(self, conn: Connection, stage_hash: str, now: datetime) -> None:
        """The ``attempt`` row of the attempt a claim just began, in the claim's transaction: an
        attempt that dies before its worker starts (queued in Ray, killed, its node lost) still
        has one. Its worker later adds the node (``record_attempt_start``), a success the env."""
        attempt_no = conn.execute(select(Stage.attempts).where(Stage.stage_hash == stage_hash)).scalar_one()
        stmt = self._insert(Attempt).values(stage_hash=stage_hash, attempt_no=attempt_no, env={},
                                            recorded_at=now, started_at=now)
        conn.execute(stmt.on_conflict_do_nothing(index_elements=["stage_hash", "attempt_no"]))

    def heartbeat(self, stage_hash: str) -> bool:
        """Refresh the heartbeat of a RUNNING stage; False if it is no longer RUNNING."""
        with self._tx() as conn:
            res = conn.execute(update(Stage).where(Stage.stage_hash == stage_hash, Stage.state == "RUNNING")
                               .values(heartbeat_at=utcnow()))
        return res.rowcount == 1

    def stale_running(self, older_than_s: float) -> list[StageRow]:
        if older_than_s < 0:
            raise ValueError(f"older_than_s must be >= 0, got {older_than_s!r}")
        cutoff = utcnow() - timedelta(seconds=older_than_s)
        last_seen = func.coalesce(Stage.heartbeat_at, Stage.started_at, Stage.updated_at)
        q = select(Stage.__table__).where(Stage.state == "RUNNING", last_seen < cutoff)
        with self._tx() as conn:
            return [StageRow.from_mapping(m) for m in conn.execute(q).mappings()]

    def record_failure(self, stage_hash: str, *, failure_class: str, message: str) -> bool:
        """Move a non-terminal stage to FAILED with its class (DESIGN §5.9 retry policy)."""
        if not failure_class or len(failure_class) > 32:
            raise ValueError(f"failure_class must be a 1..32 character string, got {failure_class!r}")
        return self.transition(stage_hash, "FAILED", expected={"PLANNED", "READY", "RUNNING", "BLOCKED"},
                               failure_class=failure_class, message=message)

    def update_stage_info(self, stage_hash: str, *, ray_run_name: str | None = None,
                          storage_uri: str | None = None, mlflow_run_id: str | None = None,
                          gpu_seconds: float | None = None, backend: str | None = None) -> None:
        """Set the given (non-None) bookkeeping fields of a stage."""
        values = {k: v for k, v in {"ray_run_name": ray_run_name, "storage_uri": storage_uri,
                                        "mlflow_run_id": mlflow_run_id, "gpu_seconds": gpu_seconds,
                                        "backend": backend}.items() if v is not None}
        if not values:
            return
        with self._tx() as conn:
            res = conn.execute(update(Stage).where(Stage.stage_hash == stage_hash)
                               .values(updated_at=utcnow(), **values))
        if res.rowcount != 1:
            raise KeyError(f"no stage {stage_hash!r}")

    # -- results ------------------------------------------------------------------------------
    def finalize_success(self, stage_hash: str, *, metrics: list[MetricRecord],
                         artifacts: list[ArtifactSpec], env: Mapping[str, Any], backend: str | None,
                         mlflow_run_id: str | None, gpu_seconds: float | None = None,
                         eval_meta: Mapping[str, Mapping[str, Any]] | None = None,
                         node_id: str | None = None) -> None:
        """Commit metrics, artifacts, the attempt's env fingerprint and SUCCEEDED in ONE
        transaction. Re-finalising upserts the same rows (no duplicates; latest values win).
        ``eval_meta``: task -> {"version": ..., "config": {...}}; ``node_id``: the Ray node the
        attempt ran on (kept from ``record_attempt_start`` when None). Raises StateError unless
        the stage is RUNNING, SUCCEEDED or FAILED, KeyError if it does not exist."""
        for m in metrics:
            if not isinstance(m, MetricRecord):
                raise TypeError(f"metrics must be MetricRecord, got {type(m).__name__}")
            if math.isnan(m.value):
                raise ValueError(f"metric {m.key()!r} of stage {stage_hash} is NaN; report a failure instead")
        for a in artifacts:
            if not isinstance(a, ArtifactSpec):
                raise TypeError(f"artifacts must be ArtifactSpec, got {type(a).__name__}")
        now = utcnow()
        with self._tx() as conn:
            row = conn.execute(select(Stage.state, Stage.attempts, Stage.started_at)
                               .where(Stage.stage_hash == stage_hash).with_for_update()).first()
            if row is None:
                raise KeyError(f"no stage {stage_hash!r}")
            if row.state not in FINALIZABLE:
                raise StateError(f"stage {stage_hash} is {row.state}; finalize_success needs one of "
                                 f"{sorted(FINALIZABLE)}")
            self._upsert_metrics(conn, stage_hash, metrics)
            self._upsert_artifacts(conn, stage_hash, artifacts, now)
            self._upsert_attempt(conn, stage_hash, row.attempts, env, now, node_id=node_id)
            for task, meta in (eval_meta or {}).items():
                self._upsert_eval_meta(conn, stage_hash, task, meta.get("version"), meta.get("config"))
            values: dict[str, Any] = {"state": "SUCCEEDED", "env": dict(env), "finished_at": now, "updated_at": now,
                                          "failure_class": None, "message": None}
            for key, val in (("backend", backend), ("mlflow_run_id", mlflow_run_id),
                             ("gpu_seconds", gpu_seconds), ("node_id", node_id)):
                if val is not None:
                    values[key] = val
            conn.execute(update(Stage).where(Stage.stage_hash == stage_hash).values(**values))

    def _upsert_metrics(self, conn: Connection, stage_hash: str, metrics: list[MetricRecord]) -> None:
        if not metrics:
            return
        rows = {}
        for m in metrics:  # last report of an identity wins, also within one call
            ident = metric_ident(m.name, m.task, m.split, m.context_len, m.depth, m.step)
            rows[ident] = {"stage_hash": stage_hash, "ident": ident, "name": m.name, "value": float(m.value),
                               "unit": m.unit, "step": m.step, "context_len": m.context_len, "depth": m.depth,
                               "task": m.task, "split": m.split, "n": m.n, "stderr": m.stderr}
        stmt = self._insert(Metric)
        stmt = stmt.on_conflict_do_update(
            index_elements=["stage_hash", "ident"],
            set_={c: stmt.excluded[c] for c in ("value", "unit", "n", "stderr")})
        conn.execute(stmt, list(rows.values()))

    def _upsert_artifacts(self, conn: Connection, stage_hash: str, artifacts: list[ArtifactSpec],
                          now: datetime) -> None:
        if not artifacts:
            return
        rows = {a.name: {"produced_by": stage_hash, "name": a.name, "uri": a.uri, "sha256": a.sha256,
                             "bytes": a.bytes, "kind": a.kind, "created_at": now} for a in artifacts}
        stmt = self._insert(Artifact)
        stmt = stmt.on_conflict_do_update(
            index_elements=["produced_by", "name"],
            set_={c: stmt.excluded[c] for c in ("uri", "sha256", "bytes", "kind", "created_at")})
        conn.execute(stmt, list(rows.values()))

    def _upsert_attempt(self, conn: Connection, stage_hash: str, attempt_no: int,
                        env: Mapping[str, Any], now: datetime, *, node_id: str | None = None) -> None:
        backend = env.get("attn_backend")
        if isinstance(backend, Mapping):  # per-layer record of the backends that ran
            backend = ",".join(sorted(set(map(str, backend.values()))))
        values = {"stage_hash": stage_hash, "attempt_no": attempt_no, "git_sha": env.get("git_sha"),
                      "dirty_diff_hash": env.get("dirty_diff_hash"), "device": env.get("device"),
                      "world_size": env.get("world_size"), "seeds": env.get("seeds"), "attn_backend": backend,
                      "packages": env.get("packages"), "env": dict(env), "recorded_at": now}
        if node_id is not None:   # else the node its worker recorded at the start stays
            values["node_id"] = node_id
        stmt = self._insert(Attempt)
        stmt = stmt.on_conflict_do_update(
            index_elements=["stage_hash", "attempt_no"],
            set_={c: stmt.excluded[c] for c in values if c not in ("stage_hash", "attempt_no")})
        conn.execute(stmt.values(**values))

    def _upsert_eval_meta(self, conn: Connection, stage_hash: str, task: str, version: Any,
                          config: Any) -> None:
        stmt = self._insert(EvalMeta).values(stage_hash=stage_hash, task=task,
                                             version=None if version is None else str(version),
                                             config=None if config is None else dict(config))
        conn.execute(stmt.on_conflict_do_update(index_elements=["stage_hash", "task"],
                                                set_={"version": stmt.excluded.version,
                                                      "config": stmt.excluded.config}))

    def record_attempt(self, stage_hash: str, env: Mapping[str, Any]) -> None:
        """Store the environment fingerprint of the current attempt (DESIGN §4); idempotent."""
        with self._tx() as conn:
            attempts = conn.execute(select(Stage.attempts).where(Stage.stage_hash == stage_hash)).scalar()
            if attempts is None:
                raise KeyError(f"no stage {stage_hash!r}")
            self._upsert_attempt(conn, stage_hash, attempts, env, utcnow())
            conn.execute(update(Stage).where(Stage.stage_hash == stage_hash).values(env=dict(env)))

    def record_attempt_start(self, stage_hash: str, attempt_no: int, node_id: str | None) -> bool:
        """Record that attempt ``attempt_no`` of a RUNNING stage started on Ray node ``node_id``
        (the ``attempt`` row, env ``{}`` until it succeeds, and ``stage.node_id``), idempotently.
        False, writing nothing, when the stage is not RUNNING that attempt any more (a stale
        worker of an earlier attempt)."""
        if isinstance(attempt_no, bool) or not isinstance(attempt_no, int) or attempt_no < 1:
            raise ValueError(f"attempt_no must be an int >= 1, got {attempt_no!r}")
        if node_id is not None and (not isinstance(node_id, str) or not 0 < len(node_id) <= 64):
            raise ValueError(f"node_id must be a 1..64 character string or None, got {node_id!r}")
        now = utcnow()
        with self._tx() as conn:
            res = conn.execute(update(Stage).where(Stage.stage_hash == stage_hash, Stage.state == "RUNNING",
                                                   Stage.attempts == attempt_no).values(node_id=node_id))
            if res.rowcount != 1:
                return False
            stmt = self._insert(Attempt).values(stage_hash=stage_hash, attempt_no=attempt_no, env={},
                                                recorded_at=now, node_id=node_id, started_at=now)
            conn.execute(stmt.on_conflict_do_update(index_elements=["stage_hash", "attempt_no"],
                                                    set_={"node_id": stmt.excluded.node_id}))
        return True

    def record_eval_meta(self, stage_hash: str, task: str, *, version: Any = None,
                         config: Mapping[str, Any] | None = None) -> None:
        with self._tx() as conn:
            self._upsert_eval_meta(conn, stage_hash, task, version, config)

    def record_table_build(self, *, table_name: str, grid: str, fmt: str, inputs: Mapping[str, str],
                           output_sha256: str) -> None:
        with self._tx() as conn:
            conn.execute(self._insert(TableBuild).values(table_name=table_name, grid=grid, fmt=fmt,
                                                         inputs=dict(inputs), output_sha256=output_sha256,
                                                         built_at=utcnow()))
