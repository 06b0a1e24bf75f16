"""How each rank ended, for the run's state (running, finished, failed, silent).

- ``ranks.outcome``: "finished" or "failed", as the collector reported on the way out; NULL while
  the rank has not reported an end (running, or killed before it could).
- ``ranks.error``: for a failed rank, the uncaught exception (type and message).
- ``ranks.ended_at``: when the service received the end.
- ``ranks.end_ns``: when the rank ended, epoch ns on rank 0's clock (the rank's own time less its
  clock offset at the end), so failures on several ranks can be put in order: the first is
  usually the cause.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("ranks") as batch:
        batch.add_column(sa.Column("outcome", sa.String(16), nullable=True))
        batch.add_column(sa.Column("error", sa.String(1000), nullable=True))
        batch.add_column(sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("end_ns", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ranks") as batch:
        batch.drop_column("end_ns")
        batch.drop_column("ended_at")
        batch.drop_column("error")
        batch.drop_column("outcome")
