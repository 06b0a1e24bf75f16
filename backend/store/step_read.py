"""One step read from the database as the analysis takes it (``analysis.StepRecord``): spans on rank 0's
clock, each rank's window and totals. Past ``analysis.span_sample``'s limit the spans are those of a sample
of whole replicas; the rows stay beside the record for the step view (they carry the bytes)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row
from sqlalchemy.orm import Session

from bubblescope.analysis import RankPlace, RankTotals, StepRecord, TimedSpan, span_sample
from bubblescope.backend.db.models import Run, StepAggregate
from bubblescope.backend.store import spans as span_queries, steps as step_queries


@dataclass(frozen=True)
class AlignedStep:
    """A step's record, its span rows (``spans.SPAN_COLUMNS``, in the record's spans' order) and the clock
    offset each rank's times were moved by."""

    record: StepRecord
    rows: Sequence[Row[Any]]
    offsets: dict[int, int]


def aligned_step(session: Session, run: Run, places: Sequence[RankPlace], step: int) -> AlignedStep | None:
    """None when the step has neither aggregates nor spans."""
    offsets = {place.rank: place.clock_offset_ns for place in places}
    aggregates = step_queries.step_aggregates(session, run.id, step)
    offsets.update(_step_offsets(aggregates))
    sampled = span_sample(places, {a.rank: a.compute_ns for a in aggregates})
    rows = span_queries.spans_of_step(session, run.id, step, sampled)
    if not aggregates and not rows:
        return None
    spans = span_queries.aligned_spans(rows, offsets)
    windows = {a.rank: (a.start_ns - offsets.get(a.rank, 0), a.end_ns - offsets.get(a.rank, 0)) for a in aggregates}
    reported = set(windows)
    for span in spans:  # a rank with spans but no aggregate: first span start to last span end
        if span.rank not in reported:
            lo, hi = windows.get(span.rank, (span.start_ns, span.end_ns))
            windows[span.rank] = (min(lo, span.start_ns), max(hi, span.end_ns))
    totals = [RankTotals(a.rank, a.compute_ns, a.comm_ns, a.exposed_comm_ns, a.idle_ns) for a in aggregates]
    return AlignedStep(StepRecord(step, spans, windows, totals, sampled), rows, offsets)


def spans_of_ranks(
    session: Session, run: Run, aligned: AlignedStep, wanted: Collection[int]
) -> list[tuple[Row[Any], TimedSpan]]:
    """The rows and aligned spans of ``wanted`` ranks, read for those outside the sample."""
    record = aligned.record
    held = [(row, span) for row, span in zip(aligned.rows, record.spans) if span.rank in wanted]
    missing = set() if record.sampled is None else set(wanted) - record.sampled
    if missing:
        rows = span_queries.spans_of_step(session, run.id, record.step, missing)
        held += zip(rows, span_queries.aligned_spans(rows, aligned.offsets))
    return held


def _step_offsets(aggregates: Sequence[StepAggregate]) -> dict[int, int]:
    """Offsets re-estimated during the run, where a step carries one (else the rank's applies)."""
    return {a.rank: a.clock_offset_ns for a in aggregates if a.clock_offset_ns is not None}
