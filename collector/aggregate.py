"""Per-step, per-rank aggregates and span columns, computed in the job (on the shipper thread).

The split itself is ``bubblescope.timesplit`` (shared with the service). Dependency waits need
the peer's spans, so the service splits those out later. The recorder's times are on this
process's ``clock.local_ns``; what leaves here is in epoch nanoseconds (``clock.to_epoch``).
"""

from __future__ import annotations

from typing import Any

from bubblescope import wire
from bubblescope.collector.clock import to_epoch
from bubblescope.collector.recorder import SpanRow, StepRecord
from bubblescope.timesplit import split_window


def step_aggregate(record: StepRecord) -> dict[str, Any]:
    """The step's totals; CUDA-timed spans get their GPU times first (this waits for the GPU)."""
    if record.gpu_events:
        from bubblescope.collector.gpu_timing import resolve

        record.gpu_anchor = resolve(record.spans, record.gpu_events, record.gpu_anchor)
        record.gpu_events = []
        if record.gpu_anchor is not None:  # the step begins on the GPU once the last step's work is done
            record.start_ns = max(record.start_ns, record.gpu_anchor[1])
    window_start = min([record.start_ns, *(row[2] for row in record.spans)])
    window_end = max([record.end_ns, *(row[3] for row in record.spans)])
    split = split_window(((row[1], row[2], row[3]) for row in record.spans), window_start, window_end)
    memory = record.memory or ()
    return {
        "step": record.step,
        "start_ns": to_epoch(window_start),
        "end_ns": to_epoch(window_end),
        "compute_ns": split.compute_ns,
        "comm_ns": split.comm_ns,
        "exposed_comm_ns": split.exposed_comm_ns,
        "idle_ns": split.idle_ns,
        "span_count": len(record.spans),
        **(
            {"clock_offset_ns": record.clock[0], "clock_uncertainty_ns": record.clock[1]}
            if record.clock is not None
            else {}
        ),
        **{field: value for field, value in zip(wire.MEMORY_FIELDS, memory) if value is not None},
    }


def span_columns(rows: list[SpanRow]) -> dict[str, list[Any]]:
    """Span rows in the column-wise wire form, their times in epoch nanoseconds."""
    columns = wire.spans_to_columns(rows)
    anchor = to_epoch(0)
    for field in ("start_ns", "end_ns"):
        columns[field] = [value + anchor for value in columns[field]]
    return columns
