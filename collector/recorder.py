"""The in-job recorder: spans into a per-step buffer, handed to the shipper at step end.

Everything on the training thread is an append to a list; aggregation, encoding and I/O
happen on the shipper's thread. A span is a tuple in ``wire.SPAN_FIELDS`` order, its times on
this process's ``clock.local_ns`` (the shipper converts them to epoch time).

The hottest callers (the pipelining wrappers, tens of spans a step) append to ``spans`` directly
while ``len(spans) < capacity`` and call ``add`` otherwise, which drops and counts the span (or,
while paused, ignores it): ``capacity`` is 0 while paused, so one comparison covers both.

Detail: only some steps travel in full (every N-th, and those the service asked to capture);
the others travel as aggregates, which need each span's kind and times only. At each step's
start the recorder asks ``detail_for(step)`` whether this one will travel in full and tells its
detail listeners when the answer changes, so that labelling which only full spans need (the
pipelining integration's micro-batch tags on P2P ops) is switched on only for those steps.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

from bubblescope import wire
from bubblescope.collector.clock import local_ns
from bubblescope.collector.gpu_timing import GpuEvents
from bubblescope.collector.memory import MemoryReading

SpanRow = tuple[Any, ...]
MAX_BLOCKED_WAITS = 4096
"""Blocking waits noted in one step (``Recorder.blocked``); beyond it compute spans keep the waits."""
StepSink = Callable[["StepRecord"], None]
DropCounter = Callable[[int], None]
DetailPolicy = Callable[[int], bool]
DetailListener = Callable[[bool], None]
Waiting = tuple[Any, ...]
"""What the training thread is blocked in, as cheap to write as possible: (kind, op name, group,
peer, bytes, since ``local_ns``) from the collectives layer, or ("p2p", the pipelining
integration's pending entry, since) from a pipeline's P2P wait; ``waiting_op`` reads either."""


def waiting_op(waiting: Waiting | None) -> dict[str, Any] | None:
    """The op a ``Recorder.waiting`` value describes (kind, name, group, peer, bytes, since_ns), or None.

    Runs on the shipper thread while the training thread may change ``waiting``: it reads one
    snapshot tuple and never raises."""
    try:
        if waiting is None:
            return None
        if waiting[0] == "p2p":
            _works, recvs, sends, posted_spans, _length = waiting[1]
            if recvs:
                _stage, _microbatch, peer, name, size = recvs[0]
                kind = "recv"
            elif sends and sends[0] < len(posted_spans):
                row = posted_spans[sends[0]]
                kind, peer, size, name = "send", row[6], row[7], row[9]
            else:
                return None
            op = (kind, name, wire.PIPELINE_GROUP, peer, size, waiting[2])
        else:
            op = waiting
        kind, name, group, peer, size, since = op
        return {
            "kind": str(kind),
            "name": None if name is None else str(name)[:64],
            "group": None if group is None else str(group)[:32],
            "peer": None if peer is None else int(peer),
            "bytes": None if size is None else int(size),
            "since_ns": int(since),
        }
    except Exception:  # noqa: BLE001 - a torn or unexpected value: report no op
        return None


class StepRecord:
    """One finished step of one rank: its window and its spans (times on ``clock.local_ns``)."""

    __slots__ = ("clock", "detailed", "end_ns", "gpu_anchor", "gpu_events", "memory", "spans", "start_ns", "step")

    def __init__(
        self,
        step: int,
        start_ns: int,
        end_ns: int,
        spans: list[SpanRow],
        clock: tuple[int, int] | None = None,
        detailed: bool = True,
    ) -> None:
        self.step = step
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.spans = spans
        self.clock = clock  # (offset to rank 0, uncertainty) in force for this step, when known
        self.detailed = detailed  # False: recorded with only what its aggregates need
        self.gpu_events: GpuEvents = []  # CUDA-timed rows, resolved off-thread
        self.gpu_anchor: tuple[Any, int] | None = None
        self.memory: MemoryReading | None = None  # the step's peaks (``memory.MemoryProbe``)


class SpanTimer:
    """Context manager returned by ``collector.span``: times its block as one span."""

    __slots__ = ("_fields", "_kind", "_recorder", "_start")

    def __init__(self, recorder: Recorder, kind: str, fields: tuple[Any, ...]) -> None:
        self._recorder = recorder
        self._kind = kind
        self._fields = fields
        self._start = 0

    def __enter__(self) -> SpanTimer:
        self._start = local_ns()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._recorder.add(self._kind, self._start, local_ns(), *self._fields)


class QuietBlock:
    """Context manager returned by ``Recorder.quiet``."""

    __slots__ = ("_recorder",)

    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder

    def __enter__(self) -> None:
        self._recorder.quiet_depth += 1

    def __exit__(self, *_exc: object) -> None:
        self._recorder.quiet_depth -= 1


class PausedBlock:
    """Context manager returned by ``Recorder.paused``."""

    __slots__ = ("_recorder",)

    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder

    def __enter__(self) -> None:
        self._recorder.set_paused_depth(self._recorder.paused_depth + 1)

    def __exit__(self, *_exc: object) -> None:
        self._recorder.set_paused_depth(self._recorder.paused_depth - 1)


class QuietSpanTimer(SpanTimer):
    """A communication span written by hand: the calls inside it are not recorded again."""

    __slots__ = ()

    def __enter__(self) -> QuietSpanTimer:
        self._recorder.quiet_depth += 1
        SpanTimer.__enter__(self)
        _stage, _microbatch, peer, size, group, name = self._fields
        self._recorder.waiting = (self._kind, name, group, peer, size, self._start)  # for the watchdog
        return self

    def __exit__(self, *exc: Any) -> None:
        self._recorder.quiet_depth -= 1
        self._recorder.stop_waiting()
        SpanTimer.__exit__(self, *exc)


class GpuSpanTimer:
    """A span timed by CUDA events on the current stream (``collector.span(..., on_gpu=True)``)."""

    __slots__ = ("_host_start", "_kind", "_microbatch", "_recorder", "_stage", "_start")

    def __init__(self, recorder: Recorder, kind: str, stage: int | None, microbatch: int | None) -> None:
        self._recorder = recorder
        self._kind = kind
        self._stage = stage
        self._microbatch = microbatch
        self._start: Any = None
        self._host_start = 0

    def __enter__(self) -> GpuSpanTimer:
        self._host_start = local_ns()  # the span's times if its events cannot be read
        self._start = self._recorder.gpu.mark()
        return self

    def __exit__(self, *_exc: object) -> None:
        recorder = self._recorder
        recorder.add_gpu(
            self._kind, self._start, recorder.gpu.mark(), self._stage, self._microbatch, host_start_ns=self._host_start
        )


class StepTimer:
    """Context manager returned by ``collector.step``: marks the step window."""

    __slots__ = ("_recorder",)

    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder

    def __enter__(self) -> StepTimer:
        self._recorder.begin_step()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._recorder.end_step()


class Recorder:
    """Buffers the spans of the current step; bounded, never raises."""

    def __init__(
        self,
        sink: StepSink,
        count_dropped: DropCounter,
        max_buffered_spans: int,
        detail_for: DetailPolicy | None = None,
    ) -> None:
        self._sink = sink
        self._count_dropped = count_dropped
        self._max_buffered = max_buffered_spans
        self.spans: list[SpanRow] = []  # this step's; a new list at each step end
        self.capacity = max_buffered_spans  # room for spans in a step: 0 while paused
        self.step_index = 0
        self._step_start: int | None = None
        self.quiet_depth = 0  # > 0 while a layer records its communication itself (no double spans)
        self.paused_depth = 0  # > 0 while the job asked for nothing to be recorded (collector.paused)
        self.clock: tuple[int, int] | None = None  # set by the session after each clock round
        self.after_step: Callable[[int], None] | None = None  # runs between steps (clock rounds)
        self.profile_hook: Callable[[int], None] | None = None  # runs between steps (profiles asked for)
        self.gpu: Any = None  # a gpu_timing.CudaStepClock when the job computes on CUDA
        self.memory: Callable[[], MemoryReading | None] | None = None  # read and reset at each step's end
        self._gpu_events: GpuEvents = []
        self._detail_for = detail_for  # None: every step in full
        # The current step travels in full: decided at its start, and only while a listener
        # records differently without detail (else every step is complete).
        self.detailed = True
        self._detail_listeners: list[DetailListener] = []
        # The communication op the training thread is blocked in now (set around each blocking
        # call and wait by the integrations, read by the shipper's watchdog): two attribute
        # writes per op, and an append to ``blocked`` as it returns, nothing else on this thread.
        self.waiting: Waiting | None = None
        # When the training thread was blocked in a communication op this step, (start, end) in order:
        # ``model_hooks`` cuts its compute spans around them. Bounded; a new list at each step's end.
        self.blocked: list[tuple[int, int]] = []
        self.pipeline_compute = False  # a pipelining integration records compute: model hooks stand down

    def stop_waiting(self) -> None:
        """The op set in ``waiting`` returned: clear it and note how long the thread was blocked in it."""
        waiting, self.waiting = self.waiting, None
        if waiting is not None and len(self.blocked) < MAX_BLOCKED_WAITS:
            self.blocked.append((waiting[-1], local_ns()))

    @property
    def step_start_ns(self) -> int | None:
        """When the current step began (``local_ns``); None between steps."""
        return self._step_start

    def add_detail_listener(self, listener: DetailListener) -> None:
        """Call ``listener(detailed)`` now and whenever a step's start changes the answer."""
        self._detail_listeners.append(listener)
        listener(self.detailed)

    def _decide_detail(self) -> None:
        try:
            detailed = self._detail_for is None or self._detail_for(self.step_index)
            if detailed != self.detailed:
                self.detailed = detailed
                for listener in self._detail_listeners:
                    listener(detailed)
        except Exception:  # noqa: BLE001 - never into the training loop; the step records in full
            self.detailed = True

    def set_paused_depth(self, depth: int) -> None:
        self.paused_depth = depth
        self.capacity = 0 if depth else self._max_buffered

    def add(
        self,
        kind: str,
        start_ns: int,
        end_ns: int,
        stage: int | None = None,
        microbatch: int | None = None,
        peer: int | None = None,
        nbytes: int | None = None,
        group: str | None = None,
        name: str | None = None,
    ) -> int:
        """Buffer one span; returns its index in this step's buffer (-1 when dropped or paused)."""
        spans = self.spans
        if len(spans) >= self.capacity:
            if not self.paused_depth:
                self._count_dropped(1)
            return -1
        spans.append((self.step_index, kind, start_ns, end_ns, stage, microbatch, peer, nbytes, group, name))
        return len(spans) - 1

    def repeat_at(self, index: int, spans: list[SpanRow], start_ns: int, end_ns: int) -> None:
        """Add a continuation of span ``index`` of the buffer ``spans`` over [start, end], with
        0 bytes; ignored once that buffer was handed over."""
        if spans is self.spans and 0 <= index < len(spans):
            row = spans[index]
            self.add(row[1], start_ns, end_ns, row[4], row[5], row[6], 0, row[8], row[9])

    def _stretch(self, index: int, end_ns: int) -> None:
        row = self.spans[index]
        self.spans[index] = row[:3] + (max(row[3], end_ns),) + row[4:]

    def extend_last(self, kind: str, microbatch: int | None, end_ns: int) -> None:
        """Stretch the newest span of this kind and micro-batch to ``end_ns`` (e.g. loss after forward);
        a CUDA-timed one to an event recorded now on the current stream."""
        if self.paused_depth:
            return
        for index in range(len(self.spans) - 1, -1, -1):
            row = self.spans[index]
            if row[1] == kind and row[5] == microbatch:
                self._stretch(index, end_ns)
                if self._gpu_events:
                    self._extend_gpu(index)
                return

    def _extend_gpu(self, index: int) -> None:
        """A CUDA-timed row's end moved to now on the current stream (its host end is replaced)."""
        events = self._gpu_events
        for position in range(len(events) - 1, -1, -1):
            if events[position][0] == index:
                if self.gpu is not None:
                    _index, start, _end, identity = events[position]
                    events[position] = (index, start, self.gpu.mark(), identity)
                return

    def span(self, kind: str, **fields: Any) -> SpanTimer | GpuSpanTimer:
        if fields.get("on_gpu") and self.gpu is not None:
            return GpuSpanTimer(self, kind, fields.get("stage"), fields.get("microbatch"))
        timer = QuietSpanTimer if kind in wire.COMMUNICATION_KINDS else SpanTimer
        return timer(
            self,
            kind,
            (
                fields.get("stage"),
                fields.get("microbatch"),
                fields.get("peer"),
                fields.get("bytes"),
                fields.get("group"),
                fields.get("name"),
            ),
        )

    def quiet(self) -> QuietBlock:
        """Context manager: torch.distributed calls inside are not recorded automatically."""
        return QuietBlock(self)

    def paused(self) -> PausedBlock:
        """Context manager: nothing is recorded inside (``collector.paused``)."""
        return PausedBlock(self)

    def step(self) -> StepTimer:
        return StepTimer(self)

    def add_gpu(self, kind: str, start_event: Any, end_event: Any, *fields: Any, host_start_ns: int) -> None:
        """A span timed by two CUDA events, ``fields`` as ``add``'s after the times. Its times are
        filled in on the shipper thread; until then, and for good if the events cannot be read,
        host times: ``host_start_ns`` (read just before ``start_event`` was recorded, which
        ``gpu_timing.resolve`` relies on) to now."""
        now = local_ns()
        index = self.add(kind, host_start_ns, now, *fields)
        if index >= 0:
            row = self.spans[index]
            self._gpu_events.append((index, start_event, end_event, row[1:3] + row[4:]))

    def begin_step(self) -> None:
        if self._detail_listeners:
            self._decide_detail()
        start = local_ns()
        for row in self.spans:  # recorded between steps (the step's batch loading): the step starts there
            if row[2] < start:
                start = row[2]
        self._step_start = start
        if self.gpu is not None:
            self.gpu.begin_step()

    def end_step(self) -> None:
        end = local_ns()
        spans, self.spans = self.spans, []
        self.blocked = []
        start = self._step_start
        if start is None:  # no explicit begin: the window is first span start to end
            start = min((row[2] for row in spans), default=end)
        record = StepRecord(self.step_index, start, end, spans, self.clock, self.detailed)
        if self.memory is not None:
            record.memory = self.memory()
        if self._gpu_events:
            record.gpu_events, self._gpu_events = self._gpu_events, []
            record.gpu_anchor = self.gpu.anchor if self.gpu is not None else None
        self._sink(record)
        self.step_index += 1
        self._step_start = None
        if self.after_step is not None:
            self.after_step(self.step_index)
        if self.profile_hook is not None:
            self.profile_hook(self.step_index)
