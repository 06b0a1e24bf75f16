"""Per-rank time breakdown of one step, with pipeline dependency waits split out.

Algorithm:
1. Dependency waits. A ``recv`` on rank r for micro-batch j, direction n, from peer q is matched
   with the ``send`` on rank q for the same j and n to peer r. The part of the recv before the
   send started is waiting for the peer to *produce* (bubble); the rest is transfer.
   An unmatched recv (peer's spans missing) counts wholly as transfer.
2. Per rank, over its window: compute C = union of compute spans, communication M = union of
   communication spans, dependency wait D = union of the waits from 1.
   overlapped = |M ∩ C|; exposed = |M| - overlapped; dependency_wait = |D| - |D ∩ C|;
   transfer = exposed - dependency_wait; idle = window - |C ∪ M|; bubble = idle + dependency_wait.
3. Step bubble (fraction of wall time, comparable with the closed forms): the step's wall
   window runs from the first rank's start to the last rank's end; each rank's bubble there is
   wall - (time computing or transferring); the step's figure is the mean over ranks.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from bubblescope import intervals, wire
from bubblescope.backend.analysis.model import RankBreakdown, StepBubble, TimedSpan
from bubblescope.backend.analysis.schedules import closed_form_bubble

Window = tuple[int, int]


def dependency_waits(spans: Iterable[TimedSpan]) -> dict[int, list[intervals.Interval]]:
    """Per receiving rank, the intervals of its recvs spent before the matching send began."""
    send_start: dict[tuple[int, int, int | None, str | None], int] = {}
    recvs: list[TimedSpan] = []
    for span in spans:
        if span.kind == "send" and span.peer is not None:
            key = (span.rank, span.peer, span.microbatch, span.name)
            send_start[key] = min(span.start_ns, send_start.get(key, span.start_ns))
        elif span.kind == "recv" and span.peer is not None:
            recvs.append(span)
    waits: dict[int, list[intervals.Interval]] = defaultdict(list)
    for recv in recvs:
        started = send_start.get((recv.peer, recv.rank, recv.microbatch, recv.name))  # type: ignore[arg-type]
        if started is not None and started > recv.start_ns:
            waits[recv.rank].append((recv.start_ns, min(started, recv.end_ns)))
    return waits


def rank_breakdown(
    rank: int,
    stage: int | None,
    spans: Iterable[TimedSpan],
    window: Window,
    waits: list[intervals.Interval],
) -> RankBreakdown:
    lo, hi = window
    own = [span for span in spans if span.rank == rank]
    compute = intervals.merge(
        intervals.clip(((s.start_ns, s.end_ns) for s in own if s.kind in wire.COMPUTE_KINDS), lo, hi)
    )
    communication = intervals.merge(
        intervals.clip(((s.start_ns, s.end_ns) for s in own if s.kind in wire.COMMUNICATION_KINDS), lo, hi)
    )
    dependency = intervals.merge(intervals.clip(waits, lo, hi))
    compute_ns = intervals.total_length(compute)
    comm_ns = intervals.total_length(communication)
    overlapped = intervals.intersect_length(compute, communication)
    exposed = comm_ns - overlapped
    dependency_ns = min(exposed, intervals.total_length(dependency) - intervals.intersect_length(dependency, compute))
    window_ns = max(0, hi - lo)
    idle = max(0, window_ns - (compute_ns + exposed))
    bubble = idle + dependency_ns
    return RankBreakdown(
        rank=rank,
        stage=stage,
        window_ns=window_ns,
        compute_ns=compute_ns,
        comm_ns=comm_ns,
        overlapped_comm_ns=overlapped,
        exposed_comm_ns=exposed,
        dependency_wait_ns=dependency_ns,
        transfer_ns=exposed - dependency_ns,
        idle_ns=idle,
        bubble_ns=bubble,
        bubble_fraction=bubble / window_ns if window_ns else 0.0,
    )


def step_breakdown(
    spans: list[TimedSpan],
    windows: Mapping[int, Window],
    stages: Mapping[int, int | None],
) -> list[RankBreakdown]:
    """Breakdown of every rank that has a window, in rank order."""
    waits = dependency_waits(spans)
    by_rank: dict[int, list[TimedSpan]] = defaultdict(list)
    for span in spans:
        by_rank[span.rank].append(span)
    return [
        rank_breakdown(rank, stages.get(rank), by_rank.get(rank, []), windows[rank], waits.get(rank, []))
        for rank in sorted(windows)
    ]


def step_bubble(
    breakdowns: list[RankBreakdown],
    windows: Mapping[int, Window],
    schedule: str | None,
    num_stages: int | None,
    num_microbatches: int | None,
    virtual_stages: int = 1,
) -> StepBubble:
    if not windows:
        return StepBubble(schedule, num_stages, num_microbatches, 0, 0.0, None, None)
    wall_ns = max(hi for _, hi in windows.values()) - min(lo for lo, _ in windows.values())
    fractions = [
        1.0 - (b.compute_ns + b.transfer_ns) / wall_ns if wall_ns else 0.0 for b in breakdowns
    ]
    floor = None
    if num_stages and num_microbatches:
        floor = closed_form_bubble(schedule, num_stages, num_microbatches, virtual_stages)
    return StepBubble(
        schedule=schedule,
        num_stages=num_stages,
        num_microbatches=num_microbatches,
        wall_ns=wall_ns,
        measured_fraction=sum(fractions) / len(fractions) if fractions else 0.0,
        theoretical_fraction=floor.fraction if floor else None,
        formula=floor.formula if floor else None,
    )
