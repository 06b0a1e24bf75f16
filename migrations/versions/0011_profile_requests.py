"""Profile requests: a capture request's kind, ``spans`` (ship the full spans of K steps) or ``profile`` (run
torch.profiler over K steps on every rank: ``POST /runs/{key}/profile``).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("capture_requests") as table:
        table.add_column(sa.Column("kind", sa.String(16), nullable=False, server_default="spans"))


def downgrade() -> None:
    with op.batch_alter_table("capture_requests") as table:
        table.drop_column("kind")
