"""SQLAlchemy 2 typed models. The schema itself is created only by the Alembic migrations."""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import JSON, BigInteger, DateTime, ForeignKey, Index, Integer, MetaData, String, UniqueConstraint, func
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar = {int: BigInteger, dict[str, Any]: JSON}


class Run(Base):
    """One execution of a training job, keyed by the collector's run key."""

    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    key: Mapped[str] = mapped_column(String(128), unique=True)
    name: Mapped[str] = mapped_column(String(128))
    world_size: Mapped[int]
    config: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    revision: Mapped[int] = mapped_column(BigInteger, server_default="0")
    """Bumped by every write to the run: what a cached read of it is valid for (``backend.derived.answers``)."""

    ranks: Mapped[list[RankInfo]] = relationship(back_populates="run", order_by="RankInfo.rank")


class RankInfo(Base):
    """A process of the run: where it ran and how its clock relates to rank 0's."""

    __tablename__ = "ranks"
    __table_args__ = (UniqueConstraint("run_id", "rank"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int]
    stage: Mapped[int | None] = mapped_column(Integer)
    stages: Mapped[list[int] | None] = mapped_column(JSON)
    coords: Mapped[dict[str, int] | None] = mapped_column(JSON)
    clock_offset_ns: Mapped[int]
    clock_uncertainty_ns: Mapped[int]
    dropped_spans: Mapped[int] = mapped_column(server_default="0")
    outcome: Mapped[str | None] = mapped_column(String(16))  # "finished" / "failed"; NULL: not ended
    error: Mapped[str | None] = mapped_column(String(1000))
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # received, service clock
    end_ns: Mapped[int | None]  # when the rank ended, epoch ns on rank 0's clock
    last_heard_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # service clock
    last_step: Mapped[int | None]  # its newest finished step
    last_step_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # a batch with steps came
    in_flight: Mapped[dict[str, Any] | None]  # the watchdog's report of a long step (wire.InFlight)
    memory_limit_bytes: Mapped[int | None]  # what the rank may use: its GPU's memory, or its share of the host's
    stage_layers: Mapped[list[int] | None] = mapped_column(JSON)  # per stage in ``stages``, counted by the collector
    stage_params: Mapped[list[int] | None] = mapped_column(JSON)

    run: Mapped[Run] = relationship(back_populates="ranks")


class StepAggregate(Base):
    """Per-rank, per-step totals computed in the job; always shipped, even for unsampled steps."""

    __tablename__ = "steps"
    __table_args__ = (UniqueConstraint("run_id", "rank", "step"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)
    step: Mapped[int]
    start_ns: Mapped[int]
    end_ns: Mapped[int]
    compute_ns: Mapped[int]
    comm_ns: Mapped[int]
    exposed_comm_ns: Mapped[int]
    idle_ns: Mapped[int]
    span_count: Mapped[int] = mapped_column(Integer)
    clock_offset_ns: Mapped[int | None]
    clock_uncertainty_ns: Mapped[int | None]
    # The step's own memory peaks (wire.MEMORY_FIELDS); NULL where the collector did not measure them.
    peak_rss_bytes: Mapped[int | None]
    gpu_peak_allocated_bytes: Mapped[int | None]
    gpu_peak_reserved_bytes: Mapped[int | None]
    gpu_alloc_retries: Mapped[int | None]


class Span(Base):
    """One timed interval on one rank. Times are epoch ns on that rank's own clock.

    No surrogate key (migration 0008: 30 of 144 bytes a span on PostgreSQL): spans are written in bulk and
    read by (run, step), never one by one; the mapper's key below is for the ORM only, not a constraint."""

    __tablename__ = "spans"
    __table_args__ = (Index("ix_spans_run_step", "run_id", "step"),)

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column()
    kind: Mapped[str] = mapped_column(String(32))
    start_ns: Mapped[int] = mapped_column()
    end_ns: Mapped[int]
    stage: Mapped[int | None] = mapped_column(Integer)
    microbatch: Mapped[int | None] = mapped_column(Integer)
    peer: Mapped[int | None] = mapped_column(Integer)
    bytes: Mapped[int | None]
    group: Mapped[str | None] = mapped_column(String(32))
    name: Mapped[str | None] = mapped_column(String(64))

    __mapper_args__ = {"primary_key": [run_id, rank, step, start_ns, kind]}  # noqa: RUF012 (SQLAlchemy's hook)


class IngestedBatch(Base):
    """Which (run, rank, seq) batches are stored: makes a retried batch a no-op."""

    __tablename__ = "ingested_batches"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    seq: Mapped[int] = mapped_column(primary_key=True)
    span_count: Mapped[int] = mapped_column(Integer)
    step_count: Mapped[int] = mapped_column(Integer, server_default="0")  # steps per batch: cadence
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class CaptureRequest(Base):
    """A request that every rank ship the full spans of steps [from_step, from_step + steps) (``kind`` "spans"), or
    run torch.profiler over them ("profile")."""

    __tablename__ = "capture_requests"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    from_step: Mapped[int]
    steps: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16), server_default="spans")
    upload_ranks: Mapped[list[int] | None] = mapped_column(JSON)  # a profile's ranks that upload their traces
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class Alert(Base):
    """One firing of an alert, in Alertmanager's shape; resolved once ``ends_at`` is set."""

    __tablename__ = "alerts"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    fingerprint: Mapped[str] = mapped_column(String(32), index=True)
    alertname: Mapped[str] = mapped_column(String(64))
    severity: Mapped[str] = mapped_column(String(16))
    labels: Mapped[dict[str, Any]]
    annotations: Mapped[dict[str, Any]]
    evidence_path: Mapped[str] = mapped_column(String(512))  # the dashboard view, relative to the service
    starts_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    ends_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), index=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class AlertDelivery(Base):
    """A notification still to send (or sent): one per alert, target and status (firing/resolved)."""

    __tablename__ = "alert_deliveries"
    __table_args__ = (UniqueConstraint("alert_id", "target", "status"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    alert_id: Mapped[int] = mapped_column(ForeignKey("alerts.id", ondelete="CASCADE"))
    target: Mapped[str] = mapped_column(String(2048))
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    next_attempt_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), index=True)
    last_error: Mapped[str | None] = mapped_column(String(1000))


class ApiToken(Base):
    """An API token: its scope and SHA-256 hash (the token itself is shown once, at creation)."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    scope: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    runs: Mapped[list[str] | None] = mapped_column(JSON)  # the run keys or key prefixes it may touch; None: every run


class DashboardSession(Base):
    """A signed-in browser: the cookie holds the session's text, the database its SHA-256 and its token."""

    __tablename__ = "sessions"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    token_id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), ForeignKey("api_tokens.id", ondelete="CASCADE")
    )
    session_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class ProfileTrace(Base):
    """One rank's torch.profiler trace of a profile request, as uploaded by its collector: imported as a run of its
    own (``trace_run_id``), listed on the profiled run's page."""

    __tablename__ = "profile_traces"

    request_id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"),
        ForeignKey("capture_requests.id", ondelete="CASCADE"),
        primary_key=True,
    )
    rank: Mapped[int] = mapped_column(primary_key=True)
    trace_run_id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), ForeignKey("runs.id", ondelete="CASCADE"), index=True
    )
    file: Mapped[str] = mapped_column(String(255))
    bytes: Mapped[int]
    uploaded_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class FlightRecorderDump(Base):
    """One rank's PyTorch Flight Recorder dump for a run, as the report reads it (``fr_dump.as_document``)."""

    __tablename__ = "flight_recorder_dumps"

    run_id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    )
    rank: Mapped[int] = mapped_column(primary_key=True)
    file: Mapped[str] = mapped_column(String(255))
    document: Mapped[dict[str, Any]]
    uploaded_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
