"""Queries the stragglers view needs: per-step aggregates over a step range."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Row, select
from sqlalchemy.orm import Session

from bubblescope.backend.db.models import StepAggregate


def aggregates_between(session: Session, run_id: int, from_step: int, to_step: int) -> Sequence[Row[tuple[int, ...]]]:
    """(rank, step, window_ns, compute_ns, comm_ns, exposed_comm_ns, idle_ns) of steps in [from, to]."""
    query = (
        select(
            StepAggregate.rank,
            StepAggregate.step,
            (StepAggregate.end_ns - StepAggregate.start_ns).label("window_ns"),
            StepAggregate.compute_ns,
            StepAggregate.comm_ns,
            StepAggregate.exposed_comm_ns,
            StepAggregate.idle_ns,
        )
        .where(StepAggregate.run_id == run_id, StepAggregate.step >= from_step, StepAggregate.step <= to_step)
        .order_by(StepAggregate.step, StepAggregate.rank)
    )
    return session.execute(query).all()
