"""Big jobs: every step aggregate carries the clock offset in force for it. Ingest now fills the
rank's registered offset where the collector sent none, so the per-step totals need no join to
``ranks`` (which PostgreSQL planned as a nested loop on tables whose statistics lagged a new run);
this fills the rows stored before.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "UPDATE steps SET clock_offset_ns = ("
        "SELECT ranks.clock_offset_ns FROM ranks WHERE ranks.run_id = steps.run_id AND ranks.rank = steps.rank"
        ") WHERE clock_offset_ns IS NULL"
    )


def downgrade() -> None:
    """Nothing to undo: an offset filled from the rank's is the one the join read."""
