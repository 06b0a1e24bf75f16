"""Interval arithmetic on half-open ``(start, end)`` nanosecond intervals (stdlib only).

Shared by the collector (per-step aggregates computed in the job) and the analysis package
(breakdowns on the service), so both count time the same way.
"""

from __future__ import annotations

from collections.abc import Iterable

Interval = tuple[int, int]


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, non-overlapping union of the intervals; empty intervals are dropped."""
    merged: list[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def total_length(merged: list[Interval]) -> int:
    """Sum of lengths of already merged intervals."""
    return sum(end - start for start, end in merged)


def union_length(intervals: Iterable[Interval]) -> int:
    """Length of the union of the intervals."""
    return total_length(merge(intervals))


def intersect_length(a: list[Interval], b: list[Interval]) -> int:
    """Length of the intersection of two merged interval lists (linear sweep)."""
    i = j = 0
    covered = 0
    while i < len(a) and j < len(b):
        start = max(a[i][0], b[j][0])
        end = min(a[i][1], b[j][1])
        if end > start:
            covered += end - start
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return covered


def clip(intervals: Iterable[Interval], lo: int, hi: int) -> list[Interval]:
    """The parts of the intervals inside ``[lo, hi)``."""
    return [(max(s, lo), min(e, hi)) for s, e in intervals if min(e, hi) > max(s, lo)]
