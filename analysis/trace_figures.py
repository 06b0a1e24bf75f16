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

import itertools
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Final

from bubblescope import intervals

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


def _union(activities: list[GpuActivity]) -> list[intervals.Interval]:
    return intervals.merge([(a.start, a.end) for a in activities])


def hta_figures(activities: list[GpuActivity], consecutive_kernel_delay: int = CONSECUTIVE_KERNEL_DELAY) -> HtaFigures:
    """HTA's temporal breakdown, idle time by cause and communication overlap of one rank (module docstring)."""
    if not activities:
        return HtaFigures(0, 0, 0, 0, {"host_wait": 0.0, "kernel_wait": 0.0, "other": 0.0}, None)
    busy = _union(activities)
    span = busy[-1][1] - busy[0][0]
    idle = span - intervals.total_length(busy)
    by_type: dict[str, list[GpuActivity]] = defaultdict(list)
    for activity in activities:
        by_type[hta_kernel_type(activity.name)].append(activity)
    compute = _union(by_type["COMPUTATION"])
    comm = _union(by_type["COMMUNICATION"])
    compute_us = intervals.total_length(compute)
    overlap = intervals.intersect_length(comm, compute) / intervals.total_length(comm) if comm else None
    return HtaFigures(
        kernel_span_us=span,
        idle_us=idle,
        compute_us=compute_us,
        non_compute_us=span - compute_us - idle,
        idle_by_cause_us=_idle_by_cause(activities, consecutive_kernel_delay),
        comm_overlap=overlap,
    )


def _idle_by_cause(activities: list[GpuActivity], delay: int) -> dict[str, float]:
    causes = {"host_wait": 0.0, "kernel_wait": 0.0, "other": 0.0}
    by_stream: dict[int, list[GpuActivity]] = defaultdict(list)
    for activity in activities:
        if activity.category in KERNEL_CATEGORIES:
            by_stream[activity.stream].append(activity)
    for stream_activities in by_stream.values():
        ordered = sorted(stream_activities, key=lambda a: a.start)
        for previous, activity in itertools.pairwise(ordered):
            gap = activity.start - previous.end
            if activity.launched_at is not None and activity.launched_at > previous.end:
                causes["host_wait"] += gap
            elif gap < delay:
                causes["kernel_wait"] += gap
            else:
                causes["other"] += gap
    return causes


def own_split(activities: list[GpuActivity]) -> OwnSplit:
    """Our classes over the same span; where classes overlap, compute wins over communication over memory."""
    if not activities:
        return OwnSplit(0, 0, 0, 0, 0)
    busy = _union(activities)
    span = busy[-1][1] - busy[0][0]
    by_class: dict[str, list[GpuActivity]] = defaultdict(list)
    for activity in activities:
        by_class[kernel_class(activity)].append(activity)
    compute = _union(by_class["compute"])
    comm = _union(by_class["communication"])
    memory = _union(by_class["memory"])
    comm_us = intervals.total_length(comm)
    exposed = comm_us - intervals.intersect_length(comm, compute)
    memory_only = intervals.total_length(memory) - intervals.intersect_length(memory, intervals.merge(compute + comm))
    return OwnSplit(
        compute_us=intervals.total_length(compute),
        communication_us=comm_us,
        exposed_communication_us=exposed,
        memory_us=memory_only,
        idle_us=span - intervals.total_length(busy),
    )
