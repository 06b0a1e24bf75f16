"""Capture-on-request and batch cadence.

- ``capture_requests``: "ship the full spans of steps [from_step, from_step + steps)", per run.
- ``ingested_batches.step_count``: how many steps each batch carried; the service reads a rank's
  cadence (steps per flush) from it to choose a ``from_step`` every rank can still capture.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "capture_requests",
        sa.Column("id", _ID, primary_key=True),
        sa.Column("run_id", _ID, nullable=False),
        sa.Column("from_step", sa.BigInteger(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_capture_requests_run_id_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_capture_requests"),
    )
    op.create_index("ix_capture_requests_run_id", "capture_requests", ["run_id"])
    with op.batch_alter_table("ingested_batches") as batch:
        batch.add_column(sa.Column("step_count", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("ingested_batches") as batch:
        batch.drop_column("step_count")
    op.drop_index("ix_capture_requests_run_id", table_name="capture_requests")
    op.drop_table("capture_requests")
