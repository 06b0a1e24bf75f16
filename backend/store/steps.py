"""Steps: per-step aggregates summed per step, the steps a run has and which have spans, each rank's
memory peaks, per-rank phase times over a range, a run's recent figures."""

from __future__ import annotations

import statistics
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import Row, func, select, text
from sqlalchemy.orm import Session

from bubblescope.analysis import RankMemory, RankStepTimes, StepSeen
from bubblescope.backend.db.models import RankInfo, Run, StepAggregate


def step_totals(session: Session, run_id: int, first: int | None = None, last: int | None = None) -> Sequence[Row[Any]]:
    """Per step (of ``first``..``last`` when given), summed in the database (a 1,024-rank run of 600
    steps has 600k aggregates): ``step``, ``ranks``, ``first_start`` and ``last_end`` on rank 0's clock,
    and the ``compute``, ``comm``, ``exposed_comm``, ``idle`` and ``windows`` (end - start) sums.

    Each aggregate carries the clock offset in force for its step (ingest fills the rank's where the
    collector sent none), so no join to ``ranks``: on tables whose statistics lag a fresh run,
    PostgreSQL planned that join as a nested loop of ranks x steps (0.8 s at 1,024 ranks, 20 steps)."""
    offset = func.coalesce(StepAggregate.clock_offset_ns, 0)
    query = (
        select(
            StepAggregate.step,
            func.count().label("ranks"),
            func.min(StepAggregate.start_ns - offset).label("first_start"),
            func.max(StepAggregate.end_ns - offset).label("last_end"),
            func.sum(StepAggregate.compute_ns).label("compute"),
            func.sum(StepAggregate.comm_ns).label("comm"),
            func.sum(StepAggregate.idle_ns).label("idle"),
            func.sum(StepAggregate.exposed_comm_ns).label("exposed_comm"),
            func.sum(StepAggregate.end_ns - StepAggregate.start_ns).label("windows"),
        )
        .where(StepAggregate.run_id == run_id)
        .group_by(StepAggregate.step)
        .order_by(StepAggregate.step)
    )
    if first is not None:
        query = query.where(StepAggregate.step >= first)
    if last is not None:
        query = query.where(StepAggregate.step <= last)
    rows: Sequence[Row[Any]] = session.execute(query).all()  # type: ignore[assignment]  # Row's column types
    return rows


def memory_peaks(session: Session, run_id: int, steps: Collection[int]) -> list[RankMemory]:
    """Each rank's highest per-step memory peaks over ``steps`` (retries summed), with its stage and
    registered limit; ranks that sent no readings are left out."""
    columns = StepAggregate
    peaks = (
        select(
            StepAggregate.rank,
            func.max(columns.peak_rss_bytes).label("peak_rss_bytes"),
            func.max(columns.gpu_peak_allocated_bytes).label("gpu_peak_allocated_bytes"),
            func.max(columns.gpu_peak_reserved_bytes).label("gpu_peak_reserved_bytes"),
            func.sum(columns.gpu_alloc_retries).label("gpu_alloc_retries"),
        )
        .where(StepAggregate.run_id == run_id, StepAggregate.step.in_(sorted(steps)))
        .where((columns.peak_rss_bytes.is_not(None)) | (columns.gpu_peak_reserved_bytes.is_not(None)))
        .group_by(StepAggregate.rank)
        .subquery()
    )
    query = (
        select(peaks, RankInfo.stage, RankInfo.memory_limit_bytes)
        .outerjoin(RankInfo, (RankInfo.run_id == run_id) & (RankInfo.rank == peaks.c.rank))
        .order_by(peaks.c.rank)
    )
    return [
        RankMemory(
            rank=row.rank,
            stage=row.stage,
            peak_rss_bytes=row.peak_rss_bytes,
            gpu_peak_allocated_bytes=row.gpu_peak_allocated_bytes,
            gpu_peak_reserved_bytes=row.gpu_peak_reserved_bytes,
            gpu_alloc_retries=None if row.gpu_alloc_retries is None else int(row.gpu_alloc_retries),
            limit_bytes=row.memory_limit_bytes,
        )
        for row in session.execute(query)
    ]


def step_aggregates(session: Session, run_id: int, step: int | None = None) -> Sequence[StepAggregate]:
    query = select(StepAggregate).where(StepAggregate.run_id == run_id)
    if step is not None:
        query = query.where(StepAggregate.step == step)
    return session.scalars(query.order_by(StepAggregate.step, StepAggregate.rank)).all()


def first_step(session: Session, run_id: int) -> int | None:
    """The lowest step any rank of the run reported (None: none yet); the warm-up counts from it."""
    return session.scalar(select(func.min(StepAggregate.step)).where(StepAggregate.run_id == run_id))


def newest_step(session: Session, run_id: int) -> int | None:
    """The highest step any rank of the run reported (None: none yet)."""
    return session.scalar(select(func.max(StepAggregate.step)).where(StepAggregate.run_id == run_id))


# One index probe per distinct step (a "loose index scan" on ix_spans_run_step), not a scan of every
# span: a 1,024-rank run holds ~100k spans per sampled step, and PostgreSQL has no skip scan of its own.
_STEPS_WITH_SPANS = text(
    """
    WITH RECURSIVE found(step) AS (
        SELECT min(step) FROM spans WHERE run_id = :run_id
        UNION ALL
        SELECT (SELECT min(step) FROM spans WHERE run_id = :run_id AND step > found.step)
        FROM found WHERE found.step IS NOT NULL
    )
    SELECT step FROM found WHERE step IS NOT NULL
    """
)


def steps_with_spans(session: Session, run_id: int) -> set[int]:
    return {int(step) for step in session.scalars(_STEPS_WITH_SPANS, {"run_id": run_id})}


def ranks_reporting(session: Session, run_id: int, first: int) -> int:
    """How many ranks reported a step from ``first`` on."""
    query = select(func.count(func.distinct(StepAggregate.rank))).where(
        StepAggregate.run_id == run_id, StepAggregate.step >= first
    )
    return int(session.scalar(query) or 0)


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


def steps_seen(totals: Sequence[Row[Any]], with_spans: Collection[int]) -> list[StepSeen]:
    """Each step of ``step_totals`` as the analysis' ``StepSeen``, in order (a step with spans but not one
    rank's aggregate is left out: no rank reported it whole)."""
    return [
        StepSeen(row.step, row.ranks, int(row.last_end - row.first_start), row.step in with_spans) for row in totals
    ]


def run_steps_seen(session: Session, run_id: int) -> list[StepSeen]:
    """Every step of the run as ``StepSeen``."""
    return steps_seen(step_totals(session, run_id), steps_with_spans(session, run_id))


RECENT_STEPS: Final = 20
"""How many of a run's newest steps its recent figures (metrics, alerts) are taken over."""


@dataclass(frozen=True)
class RecentSteps:
    """A run's newest steps in a few figures, from the per-step aggregates every rank ships."""

    steps: int
    median_step_ns: float | None  # the aligned wall window of a step, median over the steps
    idle_ratio: float | None  # idle over the ranks' windows: the bubble less waits inside communication
    exposed_comm_ratio: float | None
    ranks_reporting: int


def recent_steps(session: Session, run: Run, steps: int = RECENT_STEPS) -> RecentSteps:
    """Summed in the database: the alert rules and /metrics ask for every recent run at each round, and
    loading a 1,024-rank run's 20k aggregates as objects held the serving process' GIL ~0.3 s a round."""
    newest = newest_step(session, run.id)
    if newest is None:
        return RecentSteps(0, None, None, None, 0)
    first = newest - steps + 1
    totals = step_totals(session, run.id, first=first)
    walls = [int(row.last_end - row.first_start) for row in totals]
    windows = sum(int(row.windows) for row in totals)
    return RecentSteps(
        steps=len(totals),
        median_step_ns=statistics.median(walls) if walls else None,
        idle_ratio=sum(int(row.idle) for row in totals) / windows if windows > 0 else None,
        exposed_comm_ratio=sum(int(row.exposed_comm) for row in totals) / windows if windows > 0 else None,
        ranks_reporting=ranks_reporting(session, run.id, first),
    )
