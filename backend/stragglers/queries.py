"""Queries the stragglers view needs: per-step aggregates over a step range."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from bubblescope.analysis.stragglers import RankStepTimes
from bubblescope.backend.db.models import StepAggregate


def aggregates_between(session: Session, run_id: int, from_step: int, to_step: int) -> list[RankStepTimes]:
    """Each rank's phase times of each step in [from_step, to_step], step by step."""
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
    # on the session's connection, not through the ORM: a 16,384-rank range of 10 steps is 164k rows (0.66 -> 0.49 s)
    return list(map(RankStepTimes._make, session.connection().execute(query)))
