"""Initial catalog schema (DESIGN §5.1).

Written out explicitly (not ``metadata.create_all``) so later revisions have a fixed base;
``tests/catalog/test_migrations.py`` checks that head matches ``phaselab.catalog.store.schema``.
Timestamps are naive UTC ``DateTime`` columns (``schema.UTCDateTime`` adds the zone on read).

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "grid",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("grid_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_grid")),
        sa.UniqueConstraint("name", name=op.f("uq_grid_name")),
    )
    op.create_table(
        "stage",
        sa.Column("stage_hash", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("config", JSON, nullable=False),
        sa.Column("cache_key_parts", JSON, nullable=False),
        sa.Column("env", JSON, nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("failure_class", sa.String(length=32), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(), nullable=True),
        sa.Column("gpu_seconds", sa.Float(), nullable=True),
        sa.Column("ray_run_name", sa.String(length=200), nullable=True),
        sa.Column("storage_uri", sa.Text(), nullable=True),
        sa.Column("mlflow_run_id", sa.String(length=64), nullable=True),
        sa.Column("backend", sa.String(length=64), nullable=True),
        sa.CheckConstraint(
            "state IN ('PLANNED', 'READY', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED', 'BLOCKED')",
            name=op.f("ck_stage_state"),
        ),
        sa.CheckConstraint("attempts >= 0", name=op.f("ck_stage_attempts")),
        sa.PrimaryKeyConstraint("stage_hash", name=op.f("pk_stage")),
    )
    with op.batch_alter_table("stage", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_stage_state"), ["state"], unique=False)

    op.create_table(
        "table_build",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("table_name", sa.String(length=200), nullable=False),
        sa.Column("grid", sa.String(length=200), nullable=False),
        sa.Column("fmt", sa.String(length=16), nullable=False),
        sa.Column("inputs", JSON, nullable=False),
        sa.Column("output_sha256", sa.String(length=64), nullable=False),
        sa.Column("built_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_table_build")),
    )
    with op.batch_alter_table("table_build", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_table_build_table_name"), ["table_name"], unique=False)

    op.create_table(
        "artifact",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("produced_by", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("uri", sa.Text(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.CheckConstraint("bytes >= 0", name=op.f("ck_artifact_bytes")),
        sa.ForeignKeyConstraint(
            ["produced_by"],
            ["stage.stage_hash"],
            name=op.f("fk_artifact_produced_by_stage"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_artifact")),
        sa.UniqueConstraint("produced_by", "name", name=op.f("uq_artifact_produced_by_name")),
    )
    op.create_table(
        "attempt",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("stage_hash", sa.String(length=64), nullable=False),
        sa.Column("attempt_no", sa.Integer(), nullable=False),
        sa.Column("git_sha", sa.String(length=64), nullable=True),
        sa.Column("dirty_diff_hash", sa.String(length=64), nullable=True),
        sa.Column("device", sa.String(length=200), nullable=True),
        sa.Column("world_size", sa.Integer(), nullable=True),
        sa.Column("seeds", JSON, nullable=True),
        sa.Column("attn_backend", sa.String(length=200), nullable=True),
        sa.Column("packages", JSON, nullable=True),
        sa.Column("env", JSON, nullable=False),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["stage_hash"], ["stage.stage_hash"], name=op.f("fk_attempt_stage_hash_stage"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_attempt")),
        sa.UniqueConstraint("stage_hash", "attempt_no", name=op.f("uq_attempt_stage_hash_attempt_no")),
    )
    op.create_table(
        "cell",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("grid_id", sa.Integer(), nullable=False),
        sa.Column("cell_key", sa.String(length=500), nullable=False),
        sa.Column("axes", JSON, nullable=False),
        sa.Column("mlflow_run_id", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["grid_id"], ["grid.id"], name=op.f("fk_cell_grid_id_grid"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cell")),
        sa.UniqueConstraint("grid_id", "cell_key", name=op.f("uq_cell_grid_id_cell_key")),
    )
    op.create_table(
        "eval_meta",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("stage_hash", sa.String(length=64), nullable=False),
        sa.Column("task", sa.String(length=200), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=True),
        sa.Column("config", JSON, nullable=True),
        sa.ForeignKeyConstraint(
            ["stage_hash"],
            ["stage.stage_hash"],
            name=op.f("fk_eval_meta_stage_hash_stage"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_eval_meta")),
        sa.UniqueConstraint("stage_hash", "task", name=op.f("uq_eval_meta_stage_hash_task")),
    )
    op.create_table(
        "grid_version",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("grid_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("grid_hash", sa.String(length=64), nullable=False),
        sa.Column("yaml_submitted", sa.Text(), nullable=False),
        sa.Column("yaml_resolved", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["grid_id"], ["grid.id"], name=op.f("fk_grid_version_grid_id_grid"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_grid_version")),
        sa.UniqueConstraint("grid_id", "grid_hash", name=op.f("uq_grid_version_grid_id_grid_hash")),
        sa.UniqueConstraint("grid_id", "version", name=op.f("uq_grid_version_grid_id_version")),
    )
    op.create_table(
        "metric",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("stage_hash", sa.String(length=64), nullable=False),
        sa.Column("ident", sa.String(length=600), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("unit", sa.String(length=32), nullable=False),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("context_len", sa.Integer(), nullable=True),
        sa.Column("depth", sa.Float(), nullable=True),
        sa.Column("task", sa.String(length=200), nullable=True),
        sa.Column("split", sa.String(length=32), nullable=True),
        sa.Column("n", sa.Integer(), nullable=True),
        sa.Column("stderr", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["stage_hash"], ["stage.stage_hash"], name=op.f("fk_metric_stage_hash_stage"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_metric")),
        sa.UniqueConstraint("stage_hash", "ident", name=op.f("uq_metric_stage_hash_ident")),
    )
    op.create_table(
        "stage_edge",
        sa.Column("upstream", sa.String(length=64), nullable=False),
        sa.Column("downstream", sa.String(length=64), nullable=False),
        sa.Column("relation", sa.String(length=16), nullable=False),
        sa.CheckConstraint(
            "relation IN ('init_from', 'finetunes', 'evaluates', 'uses')", name=op.f("ck_stage_edge_relation")
        ),
        sa.ForeignKeyConstraint(
            ["downstream"],
            ["stage.stage_hash"],
            name=op.f("fk_stage_edge_downstream_stage"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["upstream"], ["stage.stage_hash"], name=op.f("fk_stage_edge_upstream_stage"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("upstream", "downstream", "relation", name=op.f("pk_stage_edge")),
    )
    with op.batch_alter_table("stage_edge", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_stage_edge_downstream"), ["downstream"], unique=False)
    op.create_table(
        "cell_stage",
        sa.Column("cell_id", sa.Integer(), nullable=False),
        sa.Column("stage_hash", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=200), nullable=True),
        sa.ForeignKeyConstraint(
            ["cell_id"], ["cell.id"], name=op.f("fk_cell_stage_cell_id_cell"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["stage_hash"],
            ["stage.stage_hash"],
            name=op.f("fk_cell_stage_stage_hash_stage"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("cell_id", "stage_hash", name=op.f("pk_cell_stage")),
    )
    with op.batch_alter_table("cell_stage", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_cell_stage_stage_hash"), ["stage_hash"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("cell_stage", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_cell_stage_stage_hash"))
    op.drop_table("cell_stage")
    with op.batch_alter_table("stage_edge", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_stage_edge_downstream"))
    op.drop_table("stage_edge")
    op.drop_table("metric")
    op.drop_table("grid_version")
    op.drop_table("eval_meta")
    op.drop_table("cell")
    op.drop_table("attempt")
    op.drop_table("artifact")
    with op.batch_alter_table("table_build", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_table_build_table_name"))

    op.drop_table("table_build")
    with op.batch_alter_table("stage", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_stage_state"))

    op.drop_table("stage")
    op.drop_table("grid")
