"""GPU span timing with CUDA events, resolved off the training thread.

On the training thread a GPU span costs two ``torch.cuda.Event.record`` calls; nothing
synchronises. Once per step an anchor event is recorded at the step's start together with the
host time. The shipper thread later waits for each step's last event (``Event.synchronize``
blocks that thread only, and is called only for an event not yet run) and converts every event to host time: anchor host time +
``anchor.elapsed_time(event)``.

Where each event is recorded:
- compute (pipeline actions, ``collector.span(..., on_gpu=True)``): on the current stream, the
  one that runs the kernels, before and after them;
- communication on CUDA tensors (collectives, point-to-point, DDP buckets, pipeline P2P): the
  start on the current stream when the op is issued (the communication stream waits for it
  before the op can begin); the end on the communication stream's completion. NCCL completes a
  Work's future at launch with CUDA events recorded on its own stream, and runs a ``then``
  callback with a pool stream made to wait on those events as the current stream, so an event
  recorded in that callback fires when the NCCL kernel ends (``mark_done``). Where no such
  future is complete at launch, the end is an event on the current stream right after
  ``Work.wait``, which makes that stream wait for the op: the time the op's result was usable.

Where the anchor is placed (``anchor_host_ns``): the GPU runs an event no earlier than the host
queued it, so the anchor's GPU time is at least each span's host start (read just before its
start event is recorded) minus the GPU time from the anchor to that event. The latest of these
bounds, and the anchor's own host time, places the step. When the GPU runs behind the host (a
deep launch queue) a span queued after the host waited for the GPU (``loss.item()``) makes that
bound exact; a step with no such wait is placed early by whatever lag no span reveals. Durations
and the order within the rank are exact either way. A row whose events cannot be read (never
recorded) keeps its host times.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bubblescope.collector.clock import local_ns

# (row index in the step, start event, end event, the row's fields but its end time)
GpuEvents = list[tuple[int, Any, Any, tuple[Any, ...]]]


class CudaStepClock:
    """Records CUDA events for spans of one step; created only when the job uses CUDA."""

    def __init__(self) -> None:
        import torch

        cuda: Any = torch.cuda  # unannotated in torch: calls through it are not checked
        self._event: Callable[[], Any] = lambda: cuda.Event(enable_timing=True)
        self._capturing = torch.cuda.is_current_stream_capturing
        self.anchor: tuple[Any, int] | None = None

    def begin_step(self) -> None:
        host_ns = local_ns()  # before the event: a lower bound of its GPU time, as spans' host starts
        self.anchor = (self.mark(), host_ns)

    def mark(self) -> Any:
        """An event on the current stream: it fires when the work queued before it is done.
        None (the span keeps host times) while a CUDA graph is being captured, where an event
        would be replayed with the graph rather than mark this step, or when CUDA fails."""
        try:
            if self._capturing():
                return None
            event = self._event()
            event.record()
            return event
        except Exception:  # noqa: BLE001 - never into the training loop
            return None

    def mark_done(self, work: Any) -> Any | None:
        """An event that fires when ``work`` (a ``torch.distributed`` Work) ends on its own
        stream; None when that cannot be known at launch (its end is then taken at the wait):
        the future is not complete yet, or it carries no CUDA tensors, so no events to wait on
        (NCCL's coalesced batches complete theirs with an empty list)."""
        try:
            future = work.get_future()
            if not future.done() or not is_cuda(future.value()):  # value(): no stream sync
                return None
            event = self._event()
            # Runs now, with a pool stream made to wait on the future's events as current stream.
            future.add_done_callback(lambda _done: event.record())
            return event
        except Exception:  # noqa: BLE001 - works without a future (gloo point-to-point)
            return None


def issue_event(clock: CudaStepClock | None, payload: Any) -> Any | None:
    """An op's start: an event on the current stream when the job times its GPU (``clock``) and
    the op works on CUDA tensors (``payload``); None otherwise, and the op keeps host times."""
    return clock.mark() if clock is not None and is_cuda(payload) else None


def first_tensor(p2p_ops: Any) -> Any:
    """The tensor of a list of P2P ops' first op, which decides their device (None if malformed:
    torch reports that itself)."""
    try:
        return p2p_ops[0].tensor
    except Exception:  # noqa: BLE001
        return None


def is_cuda(value: Any) -> bool:
    """Whether ``value`` (a tensor, or a list of tensors) lives on a CUDA device."""
    if isinstance(value, (list, tuple)):
        return bool(value) and is_cuda(value[0])
    return bool(getattr(value, "is_cuda", False))


def resolve(rows: list[tuple[Any, ...]], events: GpuEvents, anchor: tuple[Any, int] | None) -> tuple[Any, int] | None:
    """Replace the host times of ``rows`` listed in ``events`` by their GPU times (in place);
    returns the anchor as placed (its event and host time), or ``anchor`` if nothing was read.

    A row is only rewritten, and only bounds the anchor, while it is still the one its events
    were taken for (same fields but the end, its host start included): a callback on another
    thread that slipped a span in between cannot move events onto someone else's row, nor place
    the step by another row's start. That host start was read before the start event."""
    if not events or anchor is None or anchor[0] is None:
        return anchor
    anchor_event = anchor[0]
    read: list[tuple[int, tuple[Any, ...], int, int]] = []  # index, row, start and end after the anchor (ns)
    for index, start, end, identity in events:
        try:
            row = rows[index]
            if row[1:3] + row[4:] != identity:
                continue
            _wait(start)
            _wait(end)
            read.append(
                (index, row, int(anchor_event.elapsed_time(start) * 1e6), int(anchor_event.elapsed_time(end) * 1e6))
            )
        except Exception:  # noqa: BLE001 - an event never recorded: the row keeps its host times
            continue
    anchor_ns = anchor_host_ns(anchor[1], [(row[2], start_ns) for _index, row, start_ns, _end_ns in read])
    for index, row, start_ns, end_ns in read:
        rows[index] = row[:2] + (anchor_ns + start_ns, anchor_ns + max(start_ns, end_ns)) + row[4:]
    return anchor_event, anchor_ns


def _wait(event: Any) -> None:
    """Until ``event`` has run. ``query`` first: ``synchronize`` releases the GIL and takes it back, and two of
    those per span made the training thread hand the GIL to this thread dozens of times a step (an H100 DDP step
    took 1.6× as long collected); by the time the shipper reads a step its events have almost always run."""
    if not event.query():
        event.synchronize()


def anchor_host_ns(recorded_ns: int, queued: list[tuple[int, int]]) -> int:
    """When the GPU reached the step's anchor event, on the host clock: no earlier than the host
    recorded it (``recorded_ns``), nor than any event's host queue time minus the GPU time from
    the anchor to it (``queued``: pairs of those, in ns), since the GPU never runs an event
    before the host has queued it. The latest such bound, exact once any event found the GPU
    idle."""
    return max([recorded_ns, *(host_ns - after_anchor_ns for host_ns, after_anchor_ns in queued)])
