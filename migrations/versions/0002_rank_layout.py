"""Rank layout and per-step clock offsets.

- ``ranks.stages``: every pipeline stage index (virtual stage) this rank runs, in order.
- ``ranks.coords``: the rank's coordinate in each named mesh dimension, e.g. {"dp": 1, "pp": 0}.
- ``steps.clock_offset_ns`` / ``steps.clock_uncertainty_ns``: the offset to rank 0 in force for
  that step (re-estimated periodically); NULL means "use the rank's registered offset".

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("ranks") as batch:
        batch.add_column(sa.Column("stages", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("coords", sa.JSON(), nullable=True))
    with op.batch_alter_table("steps") as batch:
        batch.add_column(sa.Column("clock_offset_ns", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("clock_uncertainty_ns", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.drop_column("clock_uncertainty_ns")
        batch.drop_column("clock_offset_ns")
    with op.batch_alter_table("ranks") as batch:
        batch.drop_column("coords")
        batch.drop_column("stages")
