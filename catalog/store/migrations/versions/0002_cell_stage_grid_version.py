"""cell_stage.grid_version: which submission of the grid last linked a stage to a cell.

A re-submitted grid whose code or config changed gets new stage hashes for the same cells and
roles; without this column tables and exports would see both generations (found on a real
quickstart re-run). Rows from before this revision keep NULL and stay visible.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("cell_stage", schema=None) as batch_op:
        batch_op.add_column(sa.Column("grid_version", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cell_stage", schema=None) as batch_op:
        batch_op.drop_column("grid_version")
