"""Queries of capture-on-request: steps per batch, requests a rank has not finished."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Row, bindparam, func, select
from sqlalchemy.orm import Session

from bubblescope.backend.db.models import CaptureRequest, IngestedBatch

RECENT_BATCHES = 4
MAX_PENDING_IN_ANSWER = 16


def steps_per_batch(session: Session, run_id: int) -> int:
    """The most steps in one of each rank's last ``RECENT_BATCHES`` batches (0 when none)."""
    newest = (
        select(IngestedBatch.rank, func.max(IngestedBatch.seq).label("top"))
        .where(IngestedBatch.run_id == run_id)
        .group_by(IngestedBatch.rank)
        .subquery()
    )
    query = (
        select(func.max(IngestedBatch.step_count))
        .join(newest, newest.c.rank == IngestedBatch.rank)
        .where(IngestedBatch.run_id == run_id, IngestedBatch.seq > newest.c.top - RECENT_BATCHES)
    )
    return int(session.scalar(query) or 0)


def unfinished_requests(session: Session, run_id: int, shipped_through: int) -> Sequence[Row[tuple[int, int, int]]]:
    """The newest ``MAX_PENDING_IN_ANSWER`` requests that end past ``shipped_through``, oldest first:
    rows of (id, from_step, steps)."""
    return list(
        reversed(session.connection().execute(_UNFINISHED, {"run_id": run_id, "shipped": shipped_through}).all())
    )


_REQUESTS = CaptureRequest.__table__.c
_UNFINISHED = (  # asked on every ingest batch: built once, and rows rather than ORM objects
    select(_REQUESTS.id, _REQUESTS.from_step, _REQUESTS.steps)
    .where(
        _REQUESTS.run_id == bindparam("run_id"),
        _REQUESTS.from_step + _REQUESTS.steps - 1 > bindparam("shipped"),
    )
    .order_by(_REQUESTS.id.desc())
    .limit(MAX_PENDING_IN_ANSWER)
)


def requests_since(session: Session, run_id: int, since: datetime) -> tuple[int, datetime | None]:
    """How many requests the run got after ``since``, and when the oldest of them came."""
    query = select(func.count(), func.min(CaptureRequest.created_at)).where(
        CaptureRequest.run_id == run_id, CaptureRequest.created_at > since
    )
    count, oldest = session.execute(query).one()
    return int(count), oldest
