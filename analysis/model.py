"""Plain data the analysis functions take and return."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class TimedSpan(NamedTuple):
    """A span with times already aligned to rank 0's clock (a tuple: a 1,024-rank step builds ~100k of
    them, and a frozen dataclass cost five times as much to build)."""

    rank: int
    kind: str
    start_ns: int
    end_ns: int
    stage: int | None = None
    microbatch: int | None = None
    peer: int | None = None
    name: str | None = None
    group: str | None = None  # the process group's label ("dp", "tp", "world", ...)


@dataclass(frozen=True)
class RankBreakdown:
    """Where one rank's step window went (docs/time.md); all times in ns.

    ``window = compute + exposed_comm + idle``; ``exposed_comm = dependency_wait + transfer``;
    ``bubble = idle + dependency_wait``.
    """

    rank: int
    stage: int | None
    window_ns: int
    compute_ns: int
    comm_ns: int
    overlapped_comm_ns: int
    exposed_comm_ns: int
    dependency_wait_ns: int
    transfer_ns: int
    idle_ns: int
    bubble_ns: int
    bubble_fraction: float
    from_spans: bool = True  # False: from the rank's step aggregate (a big run's rank outside the span sample)


class RankPlace(NamedTuple):
    """Where a rank runs and its registered clock offset: what reading a step and scoring stragglers need."""

    rank: int
    host: str
    stage: int | None
    coords: dict[str, int]
    clock_offset_ns: int


@dataclass(frozen=True)
class StepBubble:
    """The step's measured bubble next to the schedule's closed-form floor."""

    schedule: str | None
    num_stages: int | None
    num_microbatches: int | None
    wall_ns: int
    measured_fraction: float
    theoretical_fraction: float | None
    formula: str | None
