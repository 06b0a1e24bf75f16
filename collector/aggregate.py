"""Per-step, per-rank aggregates computed in the job (on the shipper thread).

The split itself is ``bubblescope.timesplit`` (shared with the service). Dependency waits need
the peer's spans, so the service splits those out later.
"""

from __future__ import annotations

from typing import Any

from bubblescope.collector.recorder import StepRecord
from bubblescope.timesplit import split_window


def step_aggregate(record: StepRecord) -> dict[str, Any]:
    """The step's totals; CUDA-timed spans get their GPU times first (this waits for the GPU)."""
    if record.gpu_events:
        from bubblescope.collector.gpu_timing import resolve

        resolve(record.spans, record.gpu_events, record.gpu_anchor)
        record.gpu_events = []
    window_start = min([record.start_ns, *(row[2] for row in record.spans)])
    window_end = max([record.end_ns, *(row[3] for row in record.spans)])
    split = split_window(((row[1], row[2], row[3]) for row in record.spans), window_start, window_end)
    return {
        "step": record.step,
        "start_ns": window_start,
        "end_ns": window_end,
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
    }
