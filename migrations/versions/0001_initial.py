"""Initial schema: runs, ranks, per-rank step aggregates, spans, ingested batches.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", _ID, primary_key=True),
        sa.Column("key", sa.String(128), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("world_size", sa.BigInteger(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
        sa.UniqueConstraint("key", name="uq_runs_key"),
    )
    op.create_table(
        "ranks",
        sa.Column("id", _ID, primary_key=True),
        sa.Column("run_id", _ID, nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.BigInteger(), nullable=False),
        sa.Column("stage", sa.Integer(), nullable=True),
        sa.Column("clock_offset_ns", sa.BigInteger(), nullable=False),
        sa.Column("clock_uncertainty_ns", sa.BigInteger(), nullable=False),
        sa.Column("dropped_spans", sa.BigInteger(), server_default="0", nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_ranks_run_id_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_ranks"),
        sa.UniqueConstraint("run_id", "rank", name="uq_ranks_run_id_rank"),
    )
    op.create_table(
        "steps",
        sa.Column("id", _ID, primary_key=True),
        sa.Column("run_id", _ID, nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("start_ns", sa.BigInteger(), nullable=False),
        sa.Column("end_ns", sa.BigInteger(), nullable=False),
        sa.Column("compute_ns", sa.BigInteger(), nullable=False),
        sa.Column("comm_ns", sa.BigInteger(), nullable=False),
        sa.Column("exposed_comm_ns", sa.BigInteger(), nullable=False),
        sa.Column("idle_ns", sa.BigInteger(), nullable=False),
        sa.Column("span_count", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_steps_run_id_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_steps"),
        sa.UniqueConstraint("run_id", "rank", "step", name="uq_steps_run_id_rank_step"),
    )
    op.create_table(
        "spans",
        sa.Column("id", _ID, primary_key=True),
        sa.Column("run_id", _ID, nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("start_ns", sa.BigInteger(), nullable=False),
        sa.Column("end_ns", sa.BigInteger(), nullable=False),
        sa.Column("stage", sa.Integer(), nullable=True),
        sa.Column("microbatch", sa.Integer(), nullable=True),
        sa.Column("peer", sa.Integer(), nullable=True),
        sa.Column("bytes", sa.BigInteger(), nullable=True),
        sa.Column("group", sa.String(32), nullable=True),
        sa.Column("name", sa.String(64), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_spans_run_id_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_spans"),
    )
    op.create_index("ix_spans_run_step", "spans", ["run_id", "step"])
    op.create_table(
        "ingested_batches",
        sa.Column("run_id", _ID, nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("span_count", sa.Integer(), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_ingested_batches_run_id_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "rank", "seq", name="pk_ingested_batches"),
    )


def downgrade() -> None:
    op.drop_table("ingested_batches")
    op.drop_index("ix_spans_run_step", table_name="spans")
    op.drop_table("spans")
    op.drop_table("steps")
    op.drop_table("ranks")
    op.drop_table("runs")
