"""Per-step, per-rank aggregates computed in the job (on the shipper thread).

Definitions (DESIGN.md §4): compute = union of compute spans; communication = union of
communication spans, split into overlapped (under compute) and exposed; idle = window minus the
union of both. Dependency waits need the peer's spans, so the service splits those out later.
"""

from __future__ import annotations

from typing import Any

from bubblescope import intervals, wire
from bubblescope.collector.recorder import StepRecord


def step_aggregate(record: StepRecord) -> dict[str, Any]:
    window_start = min([record.start_ns, *(row[2] for row in record.spans)])
    window_end = max([record.end_ns, *(row[3] for row in record.spans)])
    compute = intervals.merge(
        (row[2], row[3]) for row in record.spans if row[1] in wire.COMPUTE_KINDS
    )
    communication = intervals.merge(
        (row[2], row[3]) for row in record.spans if row[1] in wire.COMMUNICATION_KINDS
    )
    compute_ns = intervals.total_length(compute)
    comm_ns = intervals.total_length(communication)
    overlapped_ns = intervals.intersect_length(compute, communication)
    busy_ns = compute_ns + comm_ns - overlapped_ns
    return {
        "step": record.step,
        "start_ns": window_start,
        "end_ns": window_end,
        "compute_ns": compute_ns,
        "comm_ns": comm_ns,
        "exposed_comm_ns": comm_ns - overlapped_ns,
        "idle_ns": max(0, (window_end - window_start) - busy_ns),
        "span_count": len(record.spans),
    }
