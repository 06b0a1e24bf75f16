"""One step as the analysis reads it, from any source (the service's database, an imported trace), and
its breakdown: each rank's compute, exposed communication, dependency wait and idle (docs/time.md).

A step's spans are on rank 0's clock. Past ``sampling.SPANS_OF_EVERY_RANK_UP_TO`` ranks a source reads
the spans of a sample of whole replicas only (``span_sample``); every other rank's breakdown then comes
from its step totals, its exposed communication split into wait and transfer as its stage's sampled
ranks' is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bubblescope.analysis.breakdown import (
    MatchedRecv,
    Window,
    aggregate_breakdown,
    matched_recvs,
    stage_wait_shares,
    step_breakdown_and_mesh_waits,
    step_bubble,
)
from bubblescope.analysis.model import RankBreakdown, RankPlace, StepBubble, TimedSpan
from bubblescope.analysis.sampling import SPANS_OF_EVERY_RANK_UP_TO, sampled_ranks


@dataclass(frozen=True)
class RankTotals:
    """A rank's own sums over its step window (the collector's per-step aggregate), ns."""

    rank: int
    compute_ns: int
    comm_ns: int
    exposed_comm_ns: int
    idle_ns: int


@dataclass(frozen=True)
class StepRecord:
    """One step: its spans on rank 0's clock, each reporting rank's window, the ranks' own totals, and
    ``sampled``: the ranks whose spans were read (None: every rank's)."""

    step: int
    spans: list[TimedSpan]
    windows: Mapping[int, Window]
    totals: Sequence[RankTotals] = ()
    sampled: frozenset[int] | None = None

    def span_windows(self) -> Mapping[int, Window]:
        """The windows of the ranks whose spans were read."""
        if self.sampled is None:
            return self.windows
        return {rank: window for rank, window in self.windows.items() if rank in self.sampled}


@dataclass(frozen=True)
class BrokenDownStep:
    """A step, its recvs matched with their sends, and each rank's breakdown in rank order (shared
    between readers: read, never change). ``mesh_wait_ns``: mean per rank whose spans were read of the
    waits for the last member inside collectives over dp, tp, ... (None: the step ran none)."""

    record: StepRecord
    breakdowns: list[RankBreakdown]
    matched: list[MatchedRecv]
    mesh_wait_ns: float | None = None


def span_sample(places: Sequence[RankPlace], compute_ns: Mapping[int, int]) -> frozenset[int] | None:
    """The ranks whose spans a source should read for a step whose ranks computed ``compute_ns``: None
    (every rank's) up to ``SPANS_OF_EVERY_RANK_UP_TO`` ranks, else the sampled replicas'."""
    if len(places) <= SPANS_OF_EVERY_RANK_UP_TO or not compute_ns:
        return None
    return sampled_ranks(
        compute_ns,
        {place.rank: place.stage for place in places},
        {place.rank: place.coords.get("dp") for place in places},
    )


def break_down_step(record: StepRecord, places: Sequence[RankPlace]) -> BrokenDownStep:
    """Every reporting rank's breakdown: from its spans, or from its totals where its spans were not read
    (outside the sample) or not recorded (a step that travelled as aggregates only, ``from_spans`` false),
    never as a window of zero compute."""
    stages = {place.rank: place.stage for place in places}
    coords = {place.rank: place.coords for place in places}
    matched = matched_recvs(record.spans)
    with_spans = {span.rank for span in record.spans}
    summed_ranks = {totals.rank for totals in record.totals if totals.rank not in with_spans}
    span_windows = {rank: window for rank, window in record.span_windows().items() if rank not in summed_ranks}
    measured, mesh = step_breakdown_and_mesh_waits(record.spans, span_windows, stages, matched, coords)
    mesh_wait = sum(mesh.values()) / max(1, len(span_windows)) if mesh else None
    if not summed_ranks:
        return BrokenDownStep(record, measured, matched, mesh_wait)
    shares = stage_wait_shares(measured)
    summed = [
        aggregate_breakdown(
            totals.rank,
            stages.get(totals.rank),
            record.windows[totals.rank],
            (totals.compute_ns, totals.comm_ns, totals.exposed_comm_ns, totals.idle_ns),
            shares.get(stages.get(totals.rank), 0.0),
        )
        for totals in record.totals
        if totals.rank in summed_ranks
    ]
    return BrokenDownStep(record, sorted([*measured, *summed], key=lambda b: b.rank), matched, mesh_wait)


def bubble_of_step(config: Mapping[str, Any], step: BrokenDownStep) -> StepBubble:
    """The step's measured bubble beside the closed form of the pipeline the run's config describes."""
    return step_bubble(
        step.breakdowns,
        step.record.windows,
        config.get("schedule"),
        config.get("num_stages"),
        config.get("num_microbatches"),
        int(config.get("virtual_stages", 1) or 1),
    )
