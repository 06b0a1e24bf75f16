"""A run's steps as Chrome trace-event JSON, which Perfetto (ui.perfetto.dev) and ``chrome://tracing`` open.

One process per rank (named with its host and stage, sorted by rank), threads that hold one span category each
(compute, communication, the step) and whose slices nest: a span that would overlap the one before it without
nesting goes to the category's next lane, a thread of its own, because Perfetto moves slices that do not nest
to overflow tracks. Each slice's ``args`` carry its step, stage, micro-batch, peer and group; a flow arrow runs
from each send to the recv it fed (``s`` at the send's start, ``f`` with ``"bp": "e"`` inside the recv); each rank's
memory peaks are counter tracks (``C`` events, one sample a step at its start: that step's own peak, in MiB). Times
are the service's aligned clock (rank 0's), in µs from ``otherData.origin_ns`` (epoch ns): µs as doubles keep
their nanoseconds only that close to their origin, and slices that do not keep them do not nest. ``BUBBLESCOPE_TRACE_MARK`` marks the document so that the
trace importer reads it back as spans.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from bubblescope import wire
from bubblescope.analysis.breakdown import MatchedRecv
from bubblescope.analysis.memory_use import RankMemory
from bubblescope.analysis.model import RankPlace, TimedSpan

BUBBLESCOPE_TRACE_MARK: Final = "bubblescope_spans"
"""The top-level key of an export: its version. Its slices' ``cat`` is the span's kind."""
CATEGORY_THREADS: Final = {"step": 1, "compute": 10, "communication": 100}  # lanes count on from each
LANE_LIMIT: Final = 9  # lanes a category may take before overlapping slices share the last one


@dataclass(frozen=True)
class ExportedStep:
    """What the export reads of one step: its aligned spans, each rank's window, its matched recvs."""

    step: int
    spans: Sequence[TimedSpan]
    windows: Mapping[int, tuple[int, int]]
    matched: Sequence[MatchedRecv]
    memory: Sequence[RankMemory] = ()  # each rank's peaks in this step (ranks that sent readings)


MEMORY_COUNTERS: Final = {  # counter name -> the step's reading; Perfetto names its track "<name> MiB"
    "peak RSS": "peak_rss_bytes",
    "GPU peak allocated": "gpu_peak_allocated_bytes",
    "GPU peak reserved": "gpu_peak_reserved_bytes",
}


def _category(kind: str) -> str:
    return "communication" if kind in wire.COMMUNICATION_KINDS else "compute"


def _us(ns: int) -> float:
    return ns / 1000.0


class _Lanes:
    """Per (rank, category): lanes of slices that nest; a slice goes to the first lane it nests in or follows."""

    def __init__(self) -> None:
        self.open: dict[tuple[int, str], list[list[int]]] = defaultdict(list)  # per lane: the open slices' ends

    def place(self, rank: int, category: str, start: int, end: int) -> int:
        lanes = self.open[(rank, category)]
        for index, stack in enumerate(lanes):
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or end <= stack[-1]:
                stack.append(end)
                return index
        if len(lanes) < LANE_LIMIT:
            lanes.append([end])
            return len(lanes) - 1
        return len(lanes) - 1


def chrome_trace(
    run_key: str, steps: Iterable[ExportedStep], places: Sequence[RankPlace], world_size: int | None = None
) -> dict[str, Any]:
    """The trace-event document of ``steps`` (their spans sorted by start per rank, as the store reads them)."""
    steps = list(steps)
    origin = min((lo for step in steps for lo, _hi in step.windows.values()), default=0)
    place_of = {place.rank: place for place in places}
    events: list[dict[str, Any]] = []
    lanes = _Lanes()
    threads: set[tuple[int, str, int]] = set()
    ranks: set[int] = set()
    flow = 0
    for step in steps:
        where: dict[tuple[int, int, str], tuple[int, int]] = {}  # (rank, start, kind) -> (thread, end)
        for rank, (lo, hi) in sorted(step.windows.items()):
            ranks.add(rank)
            threads.add((rank, "step", 0))
            events.append(
                _slice(rank, CATEGORY_THREADS["step"], f"step {step.step}", "step", lo, hi, {"step": step.step})
            )
        events += _memory_counters(step, origin)
        for span in sorted(step.spans, key=lambda s: (s.rank, s.start_ns, -s.end_ns)):
            category = _category(span.kind)
            lane = lanes.place(span.rank, category, span.start_ns, span.end_ns)
            threads.add((span.rank, category, lane))
            ranks.add(span.rank)
            tid = CATEGORY_THREADS[category] + lane
            where[(span.rank, span.start_ns, span.kind)] = (tid, span.end_ns)
            args = {
                "step": step.step,
                "stage": span.stage,
                "microbatch": span.microbatch,
                "peer": span.peer,
                "group": span.group,
                "span_name": span.name,
            }
            events.append(
                _slice(
                    span.rank,
                    tid,
                    span.name or span.kind,
                    span.kind,
                    span.start_ns - origin,
                    span.end_ns - origin,
                    args,
                )
            )
        for recv, send_start in step.matched:
            sender = where.get((recv.peer, send_start, "send")) if recv.peer is not None else None
            receiver = where.get((recv.rank, recv.start_ns, recv.kind))
            if sender is None or receiver is None:
                continue
            flow += 1
            name = recv.name or "p2p"
            events.append(
                {
                    "ph": "s",
                    "id": flow,
                    "pid": recv.peer,
                    "tid": sender[0],
                    "ts": _us(send_start - origin),
                    "name": name,
                    "cat": "p2p",
                }
            )
            events.append(
                {
                    "ph": "f",
                    "bp": "e",
                    "id": flow,
                    "pid": recv.rank,
                    "tid": receiver[0],
                    "ts": _us(recv.end_ns - 1 - origin),
                    "name": name,
                    "cat": "p2p",
                }
            )
    return {
        BUBBLESCOPE_TRACE_MARK: 1,
        "displayTimeUnit": "ms",
        "otherData": {
            "run_key": run_key,
            "world_size": world_size,
            "clock": "aligned to rank 0's clock; ts in µs from origin_ns (epoch ns)",
            "origin_ns": origin,
        },
        "traceEvents": _metadata(ranks, threads, place_of) + events,
    }


def _memory_counters(step: ExportedStep, origin: int) -> list[dict[str, Any]]:
    """One ``C`` event per rank and reading at the step's start: the step's own peak, which Perfetto holds until
    the next step's sample."""
    events = []
    for memory in step.memory:
        window = step.windows.get(memory.rank)
        if window is None:
            continue
        for name, field in MEMORY_COUNTERS.items():
            value = getattr(memory, field)
            if value is not None:
                ts = _us(window[0] - origin)
                args = {"MiB": round(value / 2**20, 3)}
                events.append({"ph": "C", "pid": memory.rank, "name": name, "ts": ts, "args": args})
    return events


def _slice(pid: int, tid: int, name: str, kind: str, start: int, end: int, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "ph": "X",
        "pid": pid,
        "tid": tid,
        "name": name,
        "cat": kind,
        "ts": _us(start),
        "dur": _us(max(0, end - start)),
        "args": {k: v for k, v in args.items() if v is not None},
    }


def _metadata(
    ranks: set[int], threads: set[tuple[int, str, int]], place_of: Mapping[int, RankPlace]
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for rank in sorted(ranks):
        place = place_of.get(rank)
        parts = [f"rank {rank}"]
        if place is not None:
            parts.append(f"host {place.host}")
            if place.stage is not None:
                parts.append(f"stage {place.stage}")
        out.append({"ph": "M", "pid": rank, "name": "process_name", "args": {"name": " · ".join(parts)}})
        out.append({"ph": "M", "pid": rank, "name": "process_sort_index", "args": {"sort_index": rank}})
    for rank, category, lane in sorted(threads):
        tid = CATEGORY_THREADS[category] + lane
        label = category if lane == 0 else f"{category} ({lane + 1})"
        out.append({"ph": "M", "pid": rank, "tid": tid, "name": "thread_name", "args": {"name": label}})
        out.append({"ph": "M", "pid": rank, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
    return out
