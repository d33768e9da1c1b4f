"""The catalog's tables as SQLAlchemy 2 typed ORM models (DESIGN §5.1).

The SQL catalog is the source of truth for DAG state and results; MLflow and Ray hold none of it.

=============  ==============================================================================
table          one row per
=============  ==============================================================================
grid           grid name (its latest hash)
grid_version   (grid, grid hash): the YAML as submitted and as resolved
cell           (grid, cell key): the axis values as JSON
stage          stage content hash (PK): kind, config, cache-key parts, state, timings, ...
cell_stage     (cell, stage) membership with the grid version that last linked it
stage_edge     (upstream, downstream, relation): init_from | finetunes | evaluates | uses
metric         (stage, identity of a MetricRecord): long format, see ``catalog.tracking``
artifact       (producing stage, artifact name): uri, sha256, bytes, kind
attempt        (stage, attempt number): the Ray node it ran on and its environment fingerprint
               (DESIGN §4; the node is written when the attempt starts, the env when it succeeds)
eval_meta      (stage, task): lm-eval task version and config (EXPERIMENTS §2.5)
table_build    one rendering of a paper table: the inputs it read, for ``--check-stale``
=============  ==============================================================================

Timestamps are stored as naive UTC and returned timezone-aware (:class:`UTCDateTime`), so the
same comparisons work on SQLite (no tz type) and PostgreSQL. The ``MetaData`` naming convention
is set from the first migration so Alembic batch migrations on SQLite can name constraints.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

STATES = ("PLANNED", "READY", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED", "BLOCKED")
RELATIONS = ("init_from", "finetunes", "evaluates", "uses")

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

JSONType = JSON().with_variant(JSONB(), "postgresql")


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator):
    """Stores naive UTC, returns aware UTC. Naive inputs are rejected (they are ambiguous)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware UTC datetime")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def metric_ident(name: str, task: str | None, split: str | None, context_len: int | None,
                 depth: float | None, step: int | None) -> str:
    """The identity of a metric row within its stage (the unique key that makes a retried report
    idempotent). NULLs are distinct in SQL unique constraints on both SQLite and PostgreSQL < 15,
    so the nullable identity fields are folded into one non-null canonical JSON string."""
    return json.dumps([name, task, split, context_len, None if depth is None else float(depth), step],
                      separators=(",", ":"))


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Grid(Base):
    __tablename__ = "grid"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    grid_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class GridVersion(Base):
    __tablename__ = "grid_version"
    __table_args__ = (UniqueConstraint("grid_id", "grid_hash"), UniqueConstraint("grid_id", "version"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    grid_id: Mapped[int] = mapped_column(ForeignKey("grid.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    grid_hash: Mapped[str] = mapped_column(String(64))
    yaml_submitted: Mapped[str] = mapped_column(Text)
    yaml_resolved: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Cell(Base):
    __tablename__ = "cell"
    __table_args__ = (UniqueConstraint("grid_id", "cell_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    grid_id: Mapped[int] = mapped_column(ForeignKey("grid.id", ondelete="CASCADE"))
    cell_key: Mapped[str] = mapped_column(String(500))
    axes: Mapped[dict[str, Any]] = mapped_column(JSONType)
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))   # unused: MLflow has no cell runs (DESIGN §5.5)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Stage(Base):
    __tablename__ = "stage"
    __table_args__ = (
        CheckConstraint(_in("state", STATES), name="state"),
        CheckConstraint("attempts >= 0", name="attempts"),
        Index(None, "state"),
    )

    stage_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    name: Mapped[str | None] = mapped_column(String(200))
    config: Mapped[dict[str, Any]] = mapped_column(JSONType)
    cache_key_parts: Mapped[dict[str, Any]] = mapped_column(JSONType)
    env: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    state: Mapped[str] = mapped_column(String(16), default="PLANNED")
    failure_class: Mapped[str | None] = mapped_column(String(32))
    message: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    owner: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    gpu_seconds: Mapped[float | None] = mapped_column(Float)
    ray_run_name: Mapped[str | None] = mapped_column(String(200))
    storage_uri: Mapped[str | None] = mapped_column(Text)
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))
    backend: Mapped[str | None] = mapped_column(String(64))
    # Ray node id (hex) of the latest attempt (0003); every attempt's node is in ``attempt``.
    node_id: Mapped[str | None] = mapped_column(String(64))


class CellStage(Base):
    __tablename__ = "cell_stage"

    cell_id: Mapped[int] = mapped_column(ForeignKey("cell.id", ondelete="CASCADE"), primary_key=True)
    stage_hash: Mapped[str] = mapped_column(ForeignKey("stage.stage_hash", ondelete="CASCADE"),
                                            primary_key=True)
    role: Mapped[str | None] = mapped_column(String(200))
    # grid_version.version of the submission that last linked this stage to the cell (0002):
    # a grid's current view is the version of its grid_hash, so stages superseded by a code or
    # config change drop out of tables and exports without being deleted.
    grid_version: Mapped[int | None] = mapped_column(Integer)

    __table_args__ = (Index(None, "stage_hash"),)


class StageEdge(Base):
    __tablename__ = "stage_edge"
    __table_args__ = (CheckConstraint(_in("relation", RELATIONS), name="relation"),
                      Index(None, "downstream"))

    upstream: Mapped[str] = mapped_column(ForeignKey("stage.stage_hash", ondelete="CASCADE"),
                                          primary_key=True)
    downstream: Mapped[str] = mapped_column(ForeignKey("stage.stage_hash", ondelete="CASCADE"),
                                            primary_key=True)
    relation: Mapped[str] = mapped_column(String(16), primary_key=True)


class Metric(Base):
    __tablename__ = "metric"
    __table_args__ = (UniqueConstraint("stage_hash", "ident"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    stage_hash: Mapped[str] = mapped_column(ForeignKey("stage.stage_hash", ondelete="CASCADE"))
    ident: Mapped[str] = mapped_column(String(600))
    name: Mapped[str] = mapped_column(String(200))
    value: Mapped[float] = mapped_column(Float)
    unit: Mapped[str] = mapped_column(String(32), default="")
    step: Mapped[int | None] = mapped_column(Integer)
    context_len: Mapped[int | None] = mapped_column(Integer)
    depth: Mapped[float | None] = mapped_column(Float)
    task: Mapped[str | None] = mapped_column(String(200))
    split: Mapped[str | None] = mapped_column(String(32))
    n: Mapped[int | None] = mapped_column(Integer)
    stderr: Mapped[float | None] = mapped_column(Float)


class Artifact(Base):
    __tablename__ = "artifact"
    __table_args__ = (
        UniqueConstraint("produced_by", "name"),
        CheckConstraint("bytes >= 0", name="bytes"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    produced_by: Mapped[str] = mapped_column(ForeignKey("stage.stage_hash", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    uri: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))
    bytes: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Attempt(Base):
    __tablename__ = "attempt"
    __table_args__ = (UniqueConstraint("stage_hash", "attempt_no"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    stage_hash: Mapped[str] = mapped_column(ForeignKey("stage.stage_hash", ondelete="CASCADE"))
    attempt_no: Mapped[int] = mapped_column(Integer)
    git_sha: Mapped[str | None] = mapped_column(String(64))
    dirty_diff_hash: Mapped[str | None] = mapped_column(String(64))
    device: Mapped[str | None] = mapped_column(String(200))
    world_size: Mapped[int | None] = mapped_column(Integer)
    seeds: Mapped[Any] = mapped_column(JSONType, nullable=True)
    attn_backend: Mapped[str | None] = mapped_column(String(200))
    packages: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    env: Mapped[dict[str, Any]] = mapped_column(JSONType)   # {} until the attempt succeeds
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # Where and when the attempt started (0003): the row and its start are written by the claim
    # that begins the attempt (so one that dies before its worker runs still has a row), the node
    # by the stage's worker when it begins (so an attempt lost with its node still names it).
    node_id: Mapped[str | None] = mapped_column(String(64))
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class EvalMeta(Base):
    __tablename__ = "eval_meta"
    __table_args__ = (UniqueConstraint("stage_hash", "task"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    stage_hash: Mapped[str] = mapped_column(ForeignKey("stage.stage_hash", ondelete="CASCADE"))
    task: Mapped[str] = mapped_column(String(200))
    version: Mapped[str | None] = mapped_column(String(64))
    config: Mapped[dict[str, Any] | None] = mapped_column(JSONType)


class TableBuild(Base):
    __tablename__ = "table_build"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    table_name: Mapped[str] = mapped_column(String(200), index=True)
    grid: Mapped[str] = mapped_column(String(200))
    fmt: Mapped[str] = mapped_column(String(16))
    # stage_hash -> "attempts|finished_at|state" of every stage whose metrics the table read
    inputs: Mapped[dict[str, Any]] = mapped_column(JSONType)
    output_sha256: Mapped[str] = mapped_column(String(64))
    built_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
