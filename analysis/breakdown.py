"""Per-rank time breakdown of one step, with pipeline dependency waits split out.

Algorithm:
1. Dependency waits: communication spent waiting for a peer to arrive (bubble), the rest transfer.
   A ``recv`` on rank r (stage s) for micro-batch j, direction n, from peer q is matched with the
   ``send`` on rank q for the same j and n to peer r whose stage feeds s (s-1 for activations, s+1
   for gradients; looped schedules send between the same two ranks once per virtual stage). The
   part of the recv before the send started is waiting for the peer to *produce*; the part of a
   send before its recv was posted, when the send outlasted that moment, is waiting for the peer
   to *consume*. An unmatched recv or send (peer's spans missing) counts wholly as transfer. Spans
   without stage ids match on ranks alone. In a collective, the part before the last participant
   arrived is a wait (``collective_waits``).
2. Per rank, over its window: compute C, communication M, overlapped, exposed and idle from
   ``bubblescope.timesplit`` (the same split the collector computes in the job); dependency
   wait D = union of the waits from 1; dependency_wait = |D| - |D ∩ C|;
   transfer = exposed - dependency_wait; bubble = idle + dependency_wait.
3. Step bubble (fraction of wall time, comparable with the closed forms): the step's wall
   window runs from the first rank's start to the last rank's end; each rank's bubble there is
   wall - (time computing or transferring); the step's figure is the mean over ranks.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from bubblescope import intervals, wire
from bubblescope.analysis.collective_waits import COLLECTIVE_KINDS, MESH_EXCLUDED, collective_waits_by_group
from bubblescope.analysis.model import RankBreakdown, StepBubble, TimedSpan
from bubblescope.analysis.schedules import stages_floor
from bubblescope.timesplit import split_window

Window = tuple[int, int]
SendKey = tuple[int, int, int | None, str | None, int | None]  # sender, receiver, micro-batch, name, stage
MatchedRecv = tuple[TimedSpan, int]  # a recv and the time its peer's matching send started


def _send_keys(send: TimedSpan) -> list[SendKey]:
    assert send.peer is not None
    keys: list[SendKey] = [(send.rank, send.peer, send.microbatch, send.name, None)]
    receiving = _receiving_stage(send)
    if receiving is not None:
        keys.append((send.rank, send.peer, send.microbatch, send.name, receiving))
    return keys


def _recv_key(recv: TimedSpan) -> SendKey:
    assert recv.peer is not None
    return (recv.peer, recv.rank, recv.microbatch, recv.name, recv.stage)


def _earliest(starts: dict[SendKey, int], key: SendKey, start: int) -> None:
    known = starts.get(key)
    if known is None or start < known:
        starts[key] = start


def matched_recvs(spans: Iterable[TimedSpan]) -> list[MatchedRecv]:
    """Every recv whose peer's matching send was recorded, with the time that send started (step 1)."""
    send_start: dict[SendKey, int] = {}
    recvs: list[TimedSpan] = []
    for span in spans:  # ~100k spans per 1,024-rank step: each send's keys built once, no set
        if span.peer is None:
            continue
        if span.kind == "send":
            for sent in _send_keys(span):
                _earliest(send_start, sent, span.start_ns)
        elif span.kind == "recv":
            recvs.append(span)
    matched = []
    for recv in recvs:
        key = _recv_key(recv)
        started = send_start.get(key, send_start.get((*key[:4], None)))
        if started is not None:
            matched.append((recv, started))
    return matched


def send_waits(spans: Iterable[TimedSpan]) -> dict[int, list[intervals.Interval]]:
    """Per sending rank, the intervals of its sends spent before the matching recv was posted, where the
    send lasted past that moment (a send that finished first did not wait for its receiver)."""
    recv_start: dict[SendKey, int] = {}
    sends: list[TimedSpan] = []
    for span in spans:
        if span.peer is None:
            continue
        if span.kind == "recv":
            key = _recv_key(span)
            _earliest(recv_start, key, span.start_ns)
            _earliest(recv_start, (*key[:4], None), span.start_ns)
        elif span.kind == "send":
            sends.append(span)
    waits: dict[int, list[intervals.Interval]] = defaultdict(list)
    for send in sends:
        keys = _send_keys(send)
        posted = next((recv_start[k] for k in reversed(keys) if k in recv_start), None)
        if posted is not None and send.start_ns < posted <= send.end_ns:
            waits[send.rank].append((send.start_ns, posted))
    return waits


def dependency_waits(matched: Iterable[MatchedRecv]) -> dict[int, list[intervals.Interval]]:
    """Per receiving rank, the intervals of its recvs spent before the matching send began."""
    waits: dict[int, list[intervals.Interval]] = defaultdict(list)
    for recv, started in matched:
        if started > recv.start_ns:
            waits[recv.rank].append((recv.start_ns, min(started, recv.end_ns)))
    return waits


def _receiving_stage(send: TimedSpan) -> int | None:
    """The stage a pipeline send feeds: the next one for activations, the previous for gradients."""
    if send.stage is None:
        return None
    if send.name == wire.P2P_FORWARD:
        return send.stage + 1
    if send.name == wire.P2P_BACKWARD:
        return send.stage - 1
    return None


def rank_breakdown(
    rank: int,
    stage: int | None,
    spans: Iterable[TimedSpan],
    window: Window,
    waits: list[intervals.Interval],
) -> RankBreakdown:
    lo, hi = window
    split = split_window(((s.kind, s.start_ns, s.end_ns) for s in spans if s.rank == rank), lo, hi)
    dependency = intervals.merge(intervals.clip(waits, lo, hi))
    exposed = split.exposed_comm_ns
    dependency_ns = min(
        exposed, intervals.total_length(dependency) - intervals.intersect_length(dependency, split.compute)
    )
    bubble = split.idle_ns + dependency_ns
    return RankBreakdown(
        rank=rank,
        stage=stage,
        window_ns=split.window_ns,
        compute_ns=split.compute_ns,
        comm_ns=split.comm_ns,
        overlapped_comm_ns=split.overlapped_comm_ns,
        exposed_comm_ns=exposed,
        dependency_wait_ns=dependency_ns,
        transfer_ns=exposed - dependency_ns,
        idle_ns=split.idle_ns,
        bubble_ns=bubble,
        bubble_fraction=bubble / split.window_ns if split.window_ns else 0.0,
    )


def step_breakdown(
    spans: list[TimedSpan],
    windows: Mapping[int, Window],
    stages: Mapping[int, int | None],
    matched: Sequence[MatchedRecv] | None = None,
    coords: Mapping[int, Mapping[str, int]] | None = None,
) -> list[RankBreakdown]:
    """Breakdown of every rank that has a window, in rank order; ``matched``: ``matched_recvs(spans)``
    where the caller has it (the analysis reads them again, 0.17 s at 1,024 ranks); ``coords``: each
    rank's mesh coordinates, which say who takes part in a "dp", "tp" ... collective."""
    return step_breakdown_and_mesh_waits(spans, windows, stages, matched, coords)[0]


def step_breakdown_and_mesh_waits(
    spans: list[TimedSpan],
    windows: Mapping[int, Window],
    stages: Mapping[int, int | None],
    matched: Sequence[MatchedRecv] | None = None,
    coords: Mapping[int, Mapping[str, int]] | None = None,
) -> tuple[list[RankBreakdown], dict[int, int]]:
    """``step_breakdown``, and for each rank that ran a collective over a mesh dimension other than the
    pipeline's (dp, tp, ...: outside what the pipeline replay models), its time waiting there for the
    call's last member (computed in the same pass)."""
    waits = dependency_waits(matched_recvs(spans) if matched is None else matched)
    mesh_waits: dict[int, list[intervals.Interval]] = defaultdict(list)
    for rank, found in send_waits(spans).items():
        waits[rank].extend(found)
    for label, by_rank_waits in collective_waits_by_group(spans, coords or {}).items():
        for rank, found in by_rank_waits.items():
            waits[rank].extend(found)
            if label not in MESH_EXCLUDED:
                mesh_waits[rank].extend(found)
    by_rank: dict[int, list[TimedSpan]] = defaultdict(list)
    in_mesh_collectives: set[int] = set()
    for span in spans:
        by_rank[span.rank].append(span)
        if span.group and span.kind in COLLECTIVE_KINDS and span.group not in MESH_EXCLUDED:
            in_mesh_collectives.add(span.rank)  # a collective over dp, tp, ...: outside the pipeline replay
    breakdowns = [
        rank_breakdown(rank, stages.get(rank), by_rank.get(rank, []), windows[rank], waits.get(rank, []))
        for rank in sorted(windows)
    ]
    return breakdowns, {
        rank: intervals.total_length(intervals.merge(mesh_waits[rank])) for rank in sorted(in_mesh_collectives)
    }


def aggregate_breakdown(
    rank: int, stage: int | None, window: Window, totals: tuple[int, int, int, int], wait_share: float
) -> RankBreakdown:
    """A rank's breakdown from its step aggregate, (compute, comm, exposed comm, idle), for a rank whose
    spans were not read (``analysis.sampling``): its exposed communication is split into dependency wait
    and transfer by ``wait_share``, its stage's sampled ranks' median share (``stage_wait_shares``)."""
    compute, comm, exposed, idle = totals
    dependency = round(exposed * wait_share)
    window_ns = window[1] - window[0]
    return RankBreakdown(
        rank=rank,
        stage=stage,
        window_ns=window_ns,
        compute_ns=compute,
        comm_ns=comm,
        overlapped_comm_ns=comm - exposed,
        exposed_comm_ns=exposed,
        dependency_wait_ns=dependency,
        transfer_ns=exposed - dependency,
        idle_ns=idle,
        bubble_ns=idle + dependency,
        bubble_fraction=(idle + dependency) / window_ns if window_ns else 0.0,
        from_spans=False,
    )


def stage_wait_shares(breakdowns: Iterable[RankBreakdown]) -> dict[int | None, float]:
    """Per stage, the median over its ranks (with exposed communication) of dependency wait / exposed."""
    shares: dict[int | None, list[float]] = defaultdict(list)
    for b in breakdowns:
        if b.exposed_comm_ns > 0:
            shares[b.stage].append(b.dependency_wait_ns / b.exposed_comm_ns)
    return {stage: statistics.median(values) for stage, values in shares.items()}


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
    fractions = [1.0 - (b.compute_ns + b.transfer_ns) / wall_ns if wall_ns else 0.0 for b in breakdowns]
    floor = stages_floor(schedule, num_stages, num_microbatches, virtual_stages)
    return StepBubble(
        schedule=schedule,
        num_stages=num_stages,
        num_microbatches=num_microbatches,
        wall_ns=wall_ns,
        measured_fraction=sum(fractions) / len(fractions) if fractions else 0.0,
        theoretical_fraction=floor.fraction if floor else None,
        formula=floor.formula if floor else None,
    )
