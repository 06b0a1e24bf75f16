"""Memory and stage sizes: each step aggregate's own peaks (``wire.MEMORY_FIELDS``: peak resident
set; on a CUDA job the allocator's peak allocated and reserved bytes and its retries); each rank's
memory limit and the layers and parameters of its stages, as the collector counted them.
All nullable: steps and ranks stored before, and collectors that do not measure, leave them empty.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

STEP_COLUMNS = ("peak_rss_bytes", "gpu_peak_allocated_bytes", "gpu_peak_reserved_bytes", "gpu_alloc_retries")


def upgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        for name in STEP_COLUMNS:
            batch.add_column(sa.Column(name, sa.BigInteger(), nullable=True))
    with op.batch_alter_table("ranks") as batch:
        batch.add_column(sa.Column("memory_limit_bytes", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("stage_layers", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("stage_params", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ranks") as batch:
        batch.drop_column("stage_params")
        batch.drop_column("stage_layers")
        batch.drop_column("memory_limit_bytes")
    with op.batch_alter_table("steps") as batch:
        for name in reversed(STEP_COLUMNS):
            batch.drop_column(name)
