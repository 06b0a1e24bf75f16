"""Holistic Trace Analysis' per-rank figures of a profiler trace, computed here, and our own split beside them.

Input: a rank's GPU activities (kernels, memcpy, memset: each with its stream, its CUDA correlation id and the
start of the runtime call that launched it) as ``bubblescope.kineto_events`` selects them the way HTA 0.5.0 does
(events kept, time rounding, last profiler step left out). Figures, as HTA defines them (its
``breakdown_analysis`` and ``communication_analysis``):

- **Temporal breakdown** over the kernel span (first activity's start to the last one's end): idle (the span
  less the union of every activity), compute (the union of computation kernels: a name that HTA's patterns do
  not take for NCCL, memory or synchronisation), non-compute (the rest of the span).
- **Idle time by cause**, per stream: each gap before an activity (its start less the previous activity's end
  on that stream) is *host wait* when the runtime call that launched it started after the previous activity
  ended (the CPU was late), else *kernel wait* when the gap is under ``consecutive_kernel_delay`` (30 trace
  units, microseconds: the launch latency of back-to-back kernels), else *other*.
- **Communication overlapped by computation**: the union of computation kernels intersected with the union of
  communication kernels, over the latter.

Our own split classifies a kernel by what it is (``kernel_class``): communication when the profiler recorded a
collective for it (its ``Collective name`` argument) or its name is NCCL's or RCCL's under any generation
(``ncclKernel_*``, ``ncclDevKernel_*``, ``rcclKernel*``...), memory for copies and fills, compute for the rest.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

# HTA 0.5.0's patterns (hta/utils/utils.py), matched at the start of the name as it does
HTA_COMM: Final = re.compile(r"^nccl.*Kernel")
HTA_MEMORY: Final = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
HTA_NOT_COMPUTE: Final = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
KERNEL_CATEGORIES: Final = frozenset(
    {"kernel", "Kernel", "gpu_memset", "Memset", "gpu_memcpy", "Memcpy", "mtia_ccp_events"}
)
"""The categories HTA's idle-time breakdown reads (its temporal breakdown reads every GPU activity)."""
CONSECUTIVE_KERNEL_DELAY: Final = 30
"""HTA's default threshold for a kernel wait, in the trace's time unit (microseconds)."""

OUR_COMM: Final = re.compile(r"^(nccl|rccl)", re.IGNORECASE)
OUR_MEMORY_CATEGORIES: Final = frozenset({"gpu_memcpy", "gpu_memset", "Memcpy", "Memset"})


@dataclass(frozen=True)
class GpuActivity:
    """One GPU activity, in the trace's time unit (microseconds, rounded as HTA rounds them)."""

    start: int
    end: int
    name: str
    category: str
    stream: int
    launched_at: int | None  # the start of the runtime call with its correlation id; None when not in the trace
    collective: str | None = None  # the ``Collective name`` the profiler recorded for it


@dataclass(frozen=True)
class HtaFigures:
    """HTA's figures for one rank, in microseconds and as shares of the kernel span."""

    kernel_span_us: int
    idle_us: int
    compute_us: int
    non_compute_us: int
    idle_by_cause_us: dict[str, float]  # host_wait, kernel_wait, other: summed over streams
    comm_overlap: float | None  # None without communication kernels

    def share(self, part_us: float) -> float:
        return part_us / self.kernel_span_us if self.kernel_span_us else 0.0


@dataclass(frozen=True)
class OwnSplit:
    """Our split of the same span: what the GPU computed, communicated, copied, and when it idled."""

    compute_us: int
    communication_us: int
    exposed_communication_us: int  # communication during which no compute kernel ran
    memory_us: int
    idle_us: int


def hta_kernel_type(name: str) -> str:
    """HTA's ``get_kernel_type``: COMMUNICATION, MEMORY, COMPUTATION or OTHER."""
    if HTA_COMM.match(name):
        return "COMMUNICATION"
    if HTA_MEMORY.match(name):
        return "MEMORY"
    if not HTA_NOT_COMPUTE.match(name):
        return "COMPUTATION"
    return "OTHER"


def kernel_class(activity: GpuActivity) -> str:
    """Ours: communication, memory or compute."""
    if activity.collective or OUR_COMM.match(activity.name):
        return "communication"
    if activity.category in OUR_MEMORY_CATEGORIES or HTA_MEMORY.match(activity.name):
        return "memory"
    return "compute"


class _Union:
    """The length of the union of intervals given in order of start, kept as it grows: no list of them."""

    __slots__ = ("_closed", "_end", "_start")

    def __init__(self) -> None:
        self._closed = 0
        self._start: int | None = None
        self._end = 0

    def add(self, start: int, end: int) -> None:
        if end <= start:
            return
        if self._start is None or start > self._end:
            if self._start is not None:
                self._closed += self._end - self._start
            self._start, self._end = start, end
        elif end > self._end:
            self._end = end

    @property
    def length(self) -> int:
        return self._closed + (self._end - self._start if self._start is not None else 0)


def figures(
    by_start: Iterable[GpuActivity],
    by_stream: Iterable[GpuActivity],
    consecutive_kernel_delay: int = CONSECUTIVE_KERNEL_DELAY,
) -> tuple[HtaFigures, OwnSplit]:
    """HTA's figures and our split of one rank, read in one pass over its activities in order of start
    (``by_start``) and one in order of stream then start (``by_stream``: the idle gaps), holding a few numbers, not
    the activities: a trace of millions of kernels is summarised in the memory of one. Each overlap is a length of
    unions: |A ∩ B| = |A| + |B| − |A ∪ B|."""
    unions = {name: _Union() for name in ("busy", "hta compute", "hta comm", "hta both", "compute", "comm", "both")}
    first: int | None = None
    last_end = 0
    for activity in by_start:
        if activity.end <= activity.start:
            continue  # nothing of the span (HTA's rounding inwards makes some, and it leaves them out)
        first = activity.start if first is None else first
        last_end = max(last_end, activity.end)
        interval = (activity.start, activity.end)
        unions["busy"].add(*interval)
        kind = hta_kernel_type(activity.name)
        for hta_type, union in (("COMPUTATION", "hta compute"), ("COMMUNICATION", "hta comm")):
            if kind == hta_type:
                unions[union].add(*interval)
                unions["hta both"].add(*interval)
        ours = kernel_class(activity)
        if ours in ("compute", "communication"):
            unions["compute" if ours == "compute" else "comm"].add(*interval)
            unions["both"].add(*interval)
    causes = _idle_by_cause(by_stream, consecutive_kernel_delay)
    if first is None:
        return HtaFigures(0, 0, 0, 0, causes, None), OwnSplit(0, 0, 0, 0, 0)
    length = {name: union.length for name, union in unions.items()}
    span, busy = last_end - first, length["busy"]
    hta_comm, hta_compute = length["hta comm"], length["hta compute"]
    overlap = (hta_comm + hta_compute - length["hta both"]) / hta_comm if hta_comm else None
    hta = HtaFigures(span, span - busy, hta_compute, span - hta_compute - (span - busy), causes, overlap)
    own = OwnSplit(
        compute_us=length["compute"],
        communication_us=length["comm"],
        exposed_communication_us=length["both"] - length["compute"],
        memory_us=busy - length["both"],  # copies while neither computing nor communicating
        idle_us=span - busy,
    )
    return hta, own


def _by_start(activities: list[GpuActivity]) -> list[GpuActivity]:
    return sorted(activities, key=lambda a: a.start)


def _by_stream(activities: list[GpuActivity]) -> list[GpuActivity]:
    return sorted(activities, key=lambda a: (a.stream, a.start))  # stable: ties keep the trace's order, as HTA's


def hta_figures(activities: list[GpuActivity], consecutive_kernel_delay: int = CONSECUTIVE_KERNEL_DELAY) -> HtaFigures:
    """HTA's temporal breakdown, idle time by cause and communication overlap of one rank (module docstring)."""
    return figures(_by_start(activities), _by_stream(activities), consecutive_kernel_delay)[0]


def _idle_by_cause(by_stream: Iterable[GpuActivity], delay: int) -> dict[str, float]:
    """Each stream's gaps by cause, its activities given in order of stream then start."""
    causes = {"host_wait": 0.0, "kernel_wait": 0.0, "other": 0.0}
    previous: GpuActivity | None = None
    for activity in by_stream:
        if activity.category not in KERNEL_CATEGORIES:
            continue
        if previous is not None and previous.stream == activity.stream:
            gap = activity.start - previous.end
            if activity.launched_at is not None and activity.launched_at > previous.end:
                causes["host_wait"] += gap
            elif gap < delay:
                causes["kernel_wait"] += gap
            else:
                causes["other"] += gap
        previous = activity
    return causes


def own_split(activities: list[GpuActivity]) -> OwnSplit:
    """Our classes over the same span; where classes overlap, compute wins over communication over memory."""
    return figures(_by_start(activities), [])[1]


class P2pCall(Protocol):
    """An NCCL send or recv kernel: when it ran, which way, and the global rank at its other end."""

    @property
    def start(self) -> Any: ...

    @property
    def end(self) -> Any: ...

    @property
    def direction(self) -> str: ...

    @property
    def peer(self) -> int: ...


def p2p_waits(calls_by_rank: Mapping[int, Sequence[P2pCall]]) -> dict[int, float]:
    """Each rank's time in recv kernels before the matching send had started on its peer (a wait for the previous
    stage, which HTA counts as communication and we count as bubble), in the traces' unit. NCCL keeps a pair's sends
    in order: the nth send from a to b is the nth recv on b from a. Ranks whose peer's trace is not given (or that
    recv nothing) are left out; the traces' clocks are taken as one (profiler timestamps are the host's epoch time)."""
    waits: dict[int, float] = {}
    for rank, calls in calls_by_rank.items():
        for peer in {call.peer for call in calls if call.direction == "recv"}:
            if peer not in calls_by_rank:
                continue
            recvs = sorted((c for c in calls if c.direction == "recv" and c.peer == peer), key=lambda c: c.start)
            sends = sorted(
                (c for c in calls_by_rank[peer] if c.direction == "send" and c.peer == rank), key=lambda c: c.start
            )
            waited = sum(max(0.0, min(send.start, recv.end) - recv.start) for recv, send in zip(recvs, sends))
            waits[rank] = waits.get(rank, 0.0) + waited
    return waits
