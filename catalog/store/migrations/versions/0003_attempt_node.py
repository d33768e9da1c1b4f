"""attempt.node_id / attempt.started_at and stage.node_id: the Ray node each attempt ran on.

On a multi-node cluster a retried stage may run on another node than the attempt that failed;
the attempt row is written when the attempt starts (by its worker), so the node of an attempt
lost with its node is kept. Rows from before this revision keep NULL.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.add_column(sa.Column("node_id", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("started_at", sa.DateTime(), nullable=True))
    with op.batch_alter_table("stage", schema=None) as batch_op:
        batch_op.add_column(sa.Column("node_id", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("stage", schema=None) as batch_op:
        batch_op.drop_column("node_id")
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.drop_column("started_at")
        batch_op.drop_column("node_id")
