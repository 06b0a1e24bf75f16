"""Flight Recorder dumps: one per rank of a run (``POST /runs/{key}/flight-recorder``), what the report reads of
each (``fr_dump.as_document``: its groups, their status, and each entry's ids, op, sizes, dtypes and state).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "flight_recorder_dumps",
        sa.Column("run_id", _ID, nullable=False),
        sa.Column("rank", sa.BigInteger(), nullable=False),
        sa.Column("file", sa.String(255), nullable=False),
        sa.Column("document", sa.JSON(), nullable=False),
        sa.Column("uploaded_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name="fk_flight_recorder_dumps_run_id_runs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "rank", name="pk_flight_recorder_dumps"),
    )


def downgrade() -> None:
    op.drop_table("flight_recorder_dumps")
