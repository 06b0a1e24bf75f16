"""Measured memory per pipeline stage, beside what may be used and what the planner predicts.

Each rank's figure is its highest per-step peak over the analysed steps: on a CUDA job the caching
allocator's peak *reserved* bytes (what the device has given the process: the figure an
out-of-memory error is about), else the process's peak resident set. A stage's figure is its
fullest rank's. The stage nearest its limit is the one with the highest peak over limit (over
bytes where no limit is known); on 1F1B it is usually the first, which holds p micro-batches'
activations where the last holds one.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

MemorySource = Literal["gpu_reserved", "host_rss"]


@dataclass(frozen=True)
class RankMemory:
    """One rank's peaks over the analysed steps (None: not measured)."""

    rank: int
    stage: int | None
    peak_rss_bytes: int | None
    gpu_peak_allocated_bytes: int | None
    gpu_peak_reserved_bytes: int | None
    gpu_alloc_retries: int | None
    limit_bytes: int | None

    @property
    def source(self) -> MemorySource | None:
        if self.gpu_peak_reserved_bytes is not None:
            return "gpu_reserved"
        return None if self.peak_rss_bytes is None else "host_rss"

    @property
    def peak_bytes(self) -> int | None:
        return self.gpu_peak_reserved_bytes if self.gpu_peak_reserved_bytes is not None else self.peak_rss_bytes


@dataclass(frozen=True)
class StageMemory:
    stage: int | None
    ranks: int
    source: MemorySource
    peak_bytes: int
    """The fullest rank's peak."""
    peak_rank: int
    median_bytes: float
    """The median over the stage's ranks of each one's peak."""
    gpu_peak_allocated_bytes: int | None
    gpu_alloc_retries: int
    """Allocation retries summed over the stage's ranks and steps: the allocator flushed its cache to fit."""
    limit_bytes: int | None
    """The smallest limit among the stage's ranks."""
    fraction_of_limit: float | None
    predicted_bytes: float | None
    """The planner's bytes per GPU for this stage's pipeline rank, where the run declared its model."""
    nearest_limit: bool


def stage_memory(ranks: Sequence[RankMemory], predicted: Mapping[int, float] | None = None) -> list[StageMemory]:
    """Per stage (ranks without a stage form one row, stage None), sorted by stage; [] with no readings.
    ``predicted`` maps a stage to the planner's bytes for it."""
    by_stage: dict[int | None, list[RankMemory]] = defaultdict(list)
    for rank in ranks:
        if rank.peak_bytes is not None:
            by_stage[rank.stage].append(rank)
    rows = []
    for stage, members in sorted(by_stage.items(), key=lambda item: (item[0] is None, item[0] or 0)):
        fullest = max(members, key=lambda r: r.peak_bytes or 0)
        peak = fullest.peak_bytes or 0
        limits = [r.limit_bytes for r in members if r.limit_bytes]
        limit = min(limits) if limits else None
        allocated = [r.gpu_peak_allocated_bytes for r in members if r.gpu_peak_allocated_bytes is not None]
        rows.append(
            StageMemory(
                stage=stage,
                ranks=len(members),
                source=fullest.source or "host_rss",
                peak_bytes=peak,
                peak_rank=fullest.rank,
                median_bytes=float(statistics.median(r.peak_bytes or 0 for r in members)),
                gpu_peak_allocated_bytes=max(allocated) if allocated else None,
                gpu_alloc_retries=sum(r.gpu_alloc_retries or 0 for r in members),
                limit_bytes=limit,
                fraction_of_limit=peak / limit if limit else None,
                predicted_bytes=None if predicted is None or stage is None else predicted.get(stage),
                nearest_limit=False,
            )
        )
    if not rows:
        return rows
    with_limits = all(row.fraction_of_limit is not None for row in rows)
    nearest = max(rows, key=lambda row: (row.fraction_of_limit or 0.0) if with_limits else row.peak_bytes)
    return [replace(row, nearest_limit=True) if row is nearest else row for row in rows]
