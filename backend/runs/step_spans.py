"""One step's spans on rank 0's clock and each rank's breakdown, read once per (run, revision, step)
and shared by the step view and the analysis. Past ``SPANS_OF_EVERY_RANK_UP_TO`` ranks the spans are
those of a sample of whole replicas (``analysis.sampling``); the other ranks' breakdowns come from their
step aggregates."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Row
from sqlalchemy.orm import Session

from bubblescope.analysis.breakdown import (
    MatchedRecv,
    aggregate_breakdown,
    matched_recvs,
    stage_wait_shares,
    step_breakdown,
)
from bubblescope.analysis.model import RankBreakdown, TimedSpan
from bubblescope.analysis.sampling import SPANS_OF_EVERY_RANK_UP_TO, sampled_ranks
from bubblescope.backend.db.models import Run, StepAggregate
from bubblescope.backend.runs import queries
from bubblescope.backend.runs.queries import RankPlace
from bubblescope.backend.runs.step_memo import ENTRIES as STEP_MEMO_ENTRIES
from bubblescope.backend.runs.step_memo import SingleFlightMemo, run_memo_key


@dataclass(frozen=True)
class AlignedStep:
    """One step's rows and spans on rank 0's clock, each rank's window and stage; ``sampled``: the ranks
    whose spans were read (None: every rank's)."""

    rows: Sequence[Row[Any]]  # queries.spans_of_step
    spans: list[TimedSpan]
    windows: dict[int, tuple[int, int]]
    stages: dict[int, int | None]
    aggregates: Sequence[StepAggregate]
    offsets: dict[int, int]
    sampled: frozenset[int] | None

    def span_windows(self) -> dict[int, tuple[int, int]]:
        """The windows of the ranks whose spans were read."""
        if self.sampled is None:
            return self.windows
        return {rank: window for rank, window in self.windows.items() if rank in self.sampled}


def aligned_spans(rows: Sequence[Row[Any]], offsets: dict[int, int]) -> list[TimedSpan]:
    """Rows unpacked in queries.SPAN_COLUMNS' order: attribute access per row cost 4 µs a span."""
    return [
        TimedSpan(rank, kind, start - offset, end - offset, stage, microbatch, peer, name, group)
        for rank, kind, start, end, stage, microbatch, peer, _bytes, group, name in cast(
            Sequence[tuple[Any, ...]], rows
        )
        for offset in (offsets.get(rank, 0),)
    ]


def aligned_step(session: Session, run: Run, ranks: Sequence[RankPlace], step: int) -> AlignedStep | None:
    """None when the step has neither aggregates nor spans."""
    offsets = {info.rank: info.clock_offset_ns for info in ranks}
    aggregates = queries.step_aggregates(session, run.id, step)
    offsets.update(_step_offsets(aggregates))
    sampled = _sample(ranks, aggregates)
    rows = queries.spans_of_step(session, run.id, step, sampled)
    if not aggregates and not rows:
        return None
    spans = aligned_spans(rows, offsets)
    windows = {a.rank: (a.start_ns - offsets.get(a.rank, 0), a.end_ns - offsets.get(a.rank, 0)) for a in aggregates}
    reported = set(windows)
    for span in spans:  # a rank with spans but no aggregate: first span start to last span end
        if span.rank not in reported:
            lo, hi = windows.get(span.rank, (span.start_ns, span.end_ns))
            windows[span.rank] = (min(lo, span.start_ns), max(hi, span.end_ns))
    stages = {info.rank: info.stage for info in ranks}
    return AlignedStep(rows, spans, windows, stages, aggregates, offsets, sampled)


def spans_of_ranks(
    session: Session, run: Run, step: int, aligned: AlignedStep, wanted: Collection[int]
) -> list[tuple[Row[Any], TimedSpan]]:
    """The rows and aligned spans of ``wanted`` ranks, read for those outside the sample."""
    held = [(row, span) for row, span in zip(aligned.rows, aligned.spans) if span.rank in wanted]
    missing = set() if aligned.sampled is None else set(wanted) - aligned.sampled
    if missing:
        rows = queries.spans_of_step(session, run.id, step, missing)
        held += zip(rows, aligned_spans(rows, aligned.offsets))
    return held


def _sample(ranks: Sequence[RankPlace], aggregates: Sequence[StepAggregate]) -> frozenset[int] | None:
    if len(ranks) <= SPANS_OF_EVERY_RANK_UP_TO or not aggregates:
        return None
    return sampled_ranks(
        {a.rank: a.compute_ns for a in aggregates},
        {info.rank: info.stage for info in ranks},
        {info.rank: info.coords.get("dp") for info in ranks},
    )


def _step_offsets(aggregates: Sequence[StepAggregate]) -> dict[int, int]:
    """Offsets re-estimated during the run, where a step carries one (else the rank's applies)."""
    return {a.rank: a.clock_offset_ns for a in aggregates if a.clock_offset_ns is not None}


@dataclass(frozen=True)
class BrokenDownStep:
    """A step's aligned spans, its recvs matched with their sends and each rank's breakdown (shared between
    requests: read, never change)."""

    aligned: AlignedStep
    breakdowns: list[RankBreakdown]
    matched: list[MatchedRecv]


_BROKEN_DOWN: SingleFlightMemo[BrokenDownStep | None] = SingleFlightMemo(STEP_MEMO_ENTRIES)
_RANK_PLACES: SingleFlightMemo[list[RankPlace]] = SingleFlightMemo(STEP_MEMO_ENTRIES)


def run_rank_places(session: Session, run: Run) -> list[RankPlace]:
    """``queries.rank_places``, once per (run, revision): the step, the analysis and the stragglers the
    page asks for at once each need them (16,384 ranks: 0.1 s)."""
    return _RANK_PLACES.get(run_memo_key(session, run, "rank places"), lambda: queries.rank_places(session, run.id))


def broken_down_step(session: Session, run: Run, step: int) -> BrokenDownStep | None:
    """``aligned_step`` and its ``step_breakdown``, once per (run, revision, step) (``step_memo``)."""

    def compute() -> BrokenDownStep | None:
        places = run_rank_places(session, run)
        aligned = aligned_step(session, run, places, step)
        if aligned is None:
            return None
        matched = matched_recvs(aligned.spans)
        coords = {p.rank: p.coords for p in places}
        measured = step_breakdown(aligned.spans, aligned.span_windows(), aligned.stages, matched, coords)
        if aligned.sampled is None:
            return BrokenDownStep(aligned, measured, matched)
        shares = stage_wait_shares(measured)
        summed = [
            aggregate_breakdown(
                a.rank,
                aligned.stages.get(a.rank),
                aligned.windows[a.rank],
                (a.compute_ns, a.comm_ns, a.exposed_comm_ns, a.idle_ns),
                shares.get(aligned.stages.get(a.rank), 0.0),
            )
            for a in aligned.aggregates
            if a.rank not in aligned.sampled
        ]
        return BrokenDownStep(aligned, sorted([*measured, *summed], key=lambda b: b.rank), matched)

    return _BROKEN_DOWN.get(run_memo_key(session, run, "step", step), compute)
