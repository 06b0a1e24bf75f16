"""GPU span timing with CUDA events, resolved off the training thread.

On the training thread a GPU span costs two ``torch.cuda.Event.record`` calls on the stream
that runs the work (the current stream); nothing synchronises. Once per step an anchor event is
recorded at the step's start together with the host time. The shipper thread later waits for
each step's last event (``Event.synchronize`` blocks that thread only) and converts every event
to host time: anchor host time + ``anchor.elapsed_time(event)``.

The anchor assumes the GPU reaches the step's first event when the host records it. When the
GPU runs behind the host (a deep launch queue), every span of that step is placed early by the
same lag; durations and the order within the rank are exact. Collectives keep host-side times:
their end is when the process group reports the work complete.
"""

from __future__ import annotations

from typing import Any

from bubblescope.collector.clock import local_ns

GpuEvents = list[tuple[int, Any, Any]]  # (row index in the step, start event, end event)


class CudaStepClock:
    """Records CUDA events for spans of one step; created only when the job uses CUDA."""

    def __init__(self) -> None:
        import torch

        self._event = lambda: torch.cuda.Event(enable_timing=True)
        self.anchor: tuple[Any, int] | None = None

    def begin_step(self) -> None:
        event = self._event()
        event.record()
        self.anchor = (event, local_ns())

    def mark(self) -> Any:
        event = self._event()
        event.record()
        return event


def resolve(rows: list[tuple[Any, ...]], events: GpuEvents, anchor: tuple[Any, int] | None) -> None:
    """Replace the host times of ``rows`` listed in ``events`` by their GPU times (in place)."""
    if not events or anchor is None:
        return
    anchor_event, anchor_ns = anchor
    events[-1][2].synchronize()
    for index, start, end in events:
        end.synchronize()
        start_ns = anchor_ns + int(anchor_event.elapsed_time(start) * 1e6)
        end_ns = anchor_ns + int(anchor_event.elapsed_time(end) * 1e6)
        row = rows[index]
        rows[index] = row[:2] + (start_ns, max(start_ns, end_ns)) + row[4:]
