"""Queries of capture-on-request: steps per batch, requests in the last hour."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from bubblescope.backend.db.models import CaptureRequest, IngestedBatch

RECENT_BATCHES = 4


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


def requests_since(session: Session, run_id: int, since: datetime) -> tuple[int, datetime | None]:
    """How many requests the run got after ``since``, and when the oldest of them came."""
    query = select(func.count(), func.min(CaptureRequest.created_at)).where(
        CaptureRequest.run_id == run_id, CaptureRequest.created_at > since
    )
    count, oldest = session.execute(query).one()
    return int(count), oldest
