"""Queries that write an ingest batch."""

from __future__ import annotations

from functools import lru_cache
from itertools import repeat

from sqlalchemy import update
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import Insert, ReturningInsert

from bubblescope import wire
from bubblescope.backend.db.bulk import insert_rows
from bubblescope.backend.db.models import Base, IngestedBatch, RankInfo, StepAggregate
from bubblescope.backend.db.upsert import conflict_insert, insert_on_conflict
from bubblescope.backend.ingest.schemas import SpanColumns, StepAggregateIn

_STEP_UPDATE = (
    "start_ns",
    "end_ns",
    "compute_ns",
    "comm_ns",
    "exposed_comm_ns",
    "idle_ns",
    "span_count",
    "clock_offset_ns",
    "clock_uncertainty_ns",
    *wire.MEMORY_FIELDS,
)


def claim_batch(session: Session, run_id: int, rank: int, seq: int, span_count: int, step_count: int) -> bool:
    """Record (run, rank, seq); False when it was already stored (a retry)."""
    row = {"run_id": run_id, "rank": rank, "seq": seq, "span_count": span_count, "step_count": step_count}
    statement = _claim(conflict_insert(session, IngestedBatch, ("run_id", "rank", "seq")))
    return session.connection().execute(statement, row).first() is not None


@lru_cache(maxsize=4)
def _claim(insert: Insert) -> ReturningInsert[tuple[int]]:
    return insert.returning(IngestedBatch.__table__.c.seq)


def insert_spans(session: Session, run_id: int, rank: int, spans: SpanColumns) -> int:
    count = len(spans.step)
    if count == 0:
        return 0
    nothing: list[None] = [None] * count
    columns = [getattr(spans, name) or nothing for name in wire.SPAN_FIELDS]
    rows = zip(repeat(run_id, count), repeat(rank, count), *columns)
    insert_rows(session, "spans", ("run_id", "rank", *wire.SPAN_FIELDS), rows)
    return count


def upsert_steps(
    session: Session, run_id: int, rank: int, steps: list[StepAggregateIn], rank_offset: int | None
) -> int:
    """Each step keeps the clock offset in force for it: the collector's, else the rank's registered
    one (``store.steps.step_totals`` reads it without a join; None until the rank registers)."""
    rows = [{"run_id": run_id, "rank": rank, **step.model_dump()} for step in steps]
    for row in rows:
        if row["clock_offset_ns"] is None:
            row["clock_offset_ns"] = rank_offset
    insert_on_conflict(session, StepAggregate, rows, ("run_id", "rank", "step"), _STEP_UPDATE)
    return len(rows)


def record_dropped(session: Session, run_id: int, rank: int, dropped: int) -> None:
    ranks = RankInfo.__table__.c
    session.execute(
        update(Base.metadata.tables[RankInfo.__tablename__])
        .where(ranks.run_id == run_id, ranks.rank == rank, ranks.dropped_spans < dropped)
        .values(dropped_spans=dropped)
    )
