"""On call: what each rank is doing now, alerts and their deliveries, API tokens.

- ``ranks.last_heard_at``: when the service last received anything from the rank (service clock),
  so the rank that went quiet first can be named; ``ranks.last_step``: its newest finished step, and
  ``ranks.last_step_at``: when a batch with steps last came (how long the run has made no progress);
  ``ranks.in_flight``: what the collector's watchdog reported while a step ran far past its usual
  length (the step, since when, and the collective or P2P op it is blocked in, if any); NULL once
  a step finishes.
- ``alerts``: one row per firing of an alert (Alertmanager's shape: labels, annotations, starts
  and ends); a fingerprint firing again after it resolved is a new row.
- ``alert_deliveries``: the outbox of notifications (a webhook per firing and per resolution),
  kept until delivered, so a restart forgets nothing.
- ``api_tokens``: tokens with one scope each (ingest, read, admin), stored as SHA-256 hashes.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("ranks") as batch:
        batch.add_column(sa.Column("last_heard_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("last_step", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("last_step_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("in_flight", sa.JSON(), nullable=True))
    op.create_table(
        "alerts",
        sa.Column("id", _ID, primary_key=True),
        sa.Column("run_id", _ID, nullable=False),
        sa.Column("fingerprint", sa.String(32), nullable=False),
        sa.Column("alertname", sa.String(64), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("annotations", sa.JSON(), nullable=False),
        sa.Column("evidence_path", sa.String(512), nullable=False),
        sa.Column("starts_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ends_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_alerts_run_id_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_alerts"),
    )
    op.create_index("ix_alerts_run_id", "alerts", ["run_id"])
    op.create_index("ix_alerts_fingerprint", "alerts", ["fingerprint"])
    op.create_index("ix_alerts_ends_at", "alerts", ["ends_at"])
    op.create_table(
        "alert_deliveries",
        sa.Column("id", _ID, primary_key=True),
        sa.Column("alert_id", _ID, nullable=False),
        sa.Column("target", sa.String(2048), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.String(1000), nullable=True),
        sa.ForeignKeyConstraint(
            ["alert_id"], ["alerts.id"], name="fk_alert_deliveries_alert_id_alerts", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_alert_deliveries"),
        sa.UniqueConstraint("alert_id", "target", "status", name="uq_alert_deliveries_alert_id_target_status"),
    )
    op.create_index("ix_alert_deliveries_delivered_at", "alert_deliveries", ["delivered_at"])
    op.create_table(
        "api_tokens",
        sa.Column("id", _ID, primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_api_tokens"),
        sa.UniqueConstraint("token_hash", name="uq_api_tokens_token_hash"),
    )


def downgrade() -> None:
    op.drop_table("api_tokens")
    op.drop_index("ix_alert_deliveries_delivered_at", "alert_deliveries")
    op.drop_table("alert_deliveries")
    op.drop_index("ix_alerts_ends_at", "alerts")
    op.drop_index("ix_alerts_fingerprint", "alerts")
    op.drop_index("ix_alerts_run_id", "alerts")
    op.drop_table("alerts")
    with op.batch_alter_table("ranks") as batch:
        batch.drop_column("in_flight")
        batch.drop_column("last_step_at")
        batch.drop_column("last_step")
        batch.drop_column("last_heard_at")
