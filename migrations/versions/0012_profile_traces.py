"""Profiles uploaded: which ranks of a profile request upload their torch.profiler trace (``capture_requests.
upload_ranks``), and each trace received (``profile_traces``: imported as a run of its own, linked here).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("capture_requests") as table:
        table.add_column(sa.Column("upload_ranks", sa.JSON(), nullable=True))
    op.create_table(
        "profile_traces",
        sa.Column("request_id", _ID, nullable=False),
        sa.Column("rank", sa.BigInteger(), nullable=False),
        sa.Column("trace_run_id", _ID, nullable=False),
        sa.Column("file", sa.String(255), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("uploaded_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(
            ["request_id"],
            ["capture_requests.id"],
            name="fk_profile_traces_request_id_capture_requests",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["trace_run_id"], ["runs.id"], name="fk_profile_traces_trace_run_id_runs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("request_id", "rank", name="pk_profile_traces"),
    )
    op.create_index("ix_profile_traces_trace_run_id", "profile_traces", ["trace_run_id"])


def downgrade() -> None:
    op.drop_index("ix_profile_traces_trace_run_id", "profile_traces")
    op.drop_table("profile_traces")
    with op.batch_alter_table("capture_requests") as table:
        table.drop_column("upload_ranks")
