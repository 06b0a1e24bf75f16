"""Tokens bound to runs: ``api_tokens.runs``, the run keys (or key prefixes ending in ``*``) a token may touch.
Existing tokens get NULL: every run, as before (docs/access.md).

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_tokens") as table:
        table.add_column(sa.Column("runs", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_tokens") as table:
        table.drop_column("runs")
