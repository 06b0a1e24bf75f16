"""Spans lose their surrogate key. Nothing reads a span by its id; on PostgreSQL the 8-byte column and its
primary-key index were 30 of the 144 bytes a span took (114 without, measured on a million rows). Chunked
deletes name a span by its physical address instead (``ctid``, SQLite's ``rowid``, which an
``INTEGER PRIMARY KEY`` only aliased). SQLite rebuilds the table: it copies every span once.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_constraint("pk_spans", "spans", type_="primary")
        op.drop_column("spans", "id")
        return
    with op.batch_alter_table("spans", recreate="always") as batch:  # SQLite: the key goes with its column
        batch.drop_column("id")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE spans ADD COLUMN id BIGSERIAL")
        op.create_primary_key("pk_spans", "spans", ["id"])
        return
    with op.batch_alter_table("spans", recreate="always") as batch:  # SQLite: the rowid fills it
        batch.add_column(sa.Column("id", sa.Integer(), primary_key=True))
