"""Where a window of one rank's time went (docs/time.md), stdlib only.

The one definition used by the collector's per-step aggregates and the service's breakdown:
compute = union of compute spans; communication = union of communication spans, split into
overlapped (under compute) and exposed; idle = window minus the union of both.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from bubblescope import intervals, wire


@dataclass(frozen=True)
class TimeSplit:
    window_ns: int
    compute_ns: int
    comm_ns: int
    overlapped_comm_ns: int
    idle_ns: int
    compute: list[intervals.Interval]  # merged, for callers that intersect further

    @property
    def exposed_comm_ns(self) -> int:
        return self.comm_ns - self.overlapped_comm_ns


def split_window(spans: Iterable[tuple[str, int, int]], lo: int, hi: int) -> TimeSplit:
    """``spans`` are (kind, start_ns, end_ns); only their parts inside ``[lo, hi)`` count."""
    compute_spans: list[intervals.Interval] = []
    comm_spans: list[intervals.Interval] = []
    for kind, start, end in spans:
        if kind in wire.COMPUTE_KINDS:
            compute_spans.append((start, end))
        elif kind in wire.COMMUNICATION_KINDS:
            comm_spans.append((start, end))
    compute = intervals.merge(intervals.clip(compute_spans, lo, hi))
    communication = intervals.merge(intervals.clip(comm_spans, lo, hi))
    compute_ns = intervals.total_length(compute)
    comm_ns = intervals.total_length(communication)
    overlapped = intervals.intersect_length(compute, communication)
    window_ns = max(0, hi - lo)
    return TimeSplit(
        window_ns=window_ns,
        compute_ns=compute_ns,
        comm_ns=comm_ns,
        overlapped_comm_ns=overlapped,
        idle_ns=max(0, window_ns - (compute_ns + comm_ns - overlapped)),
        compute=compute,
    )
