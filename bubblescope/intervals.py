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
    """Length of the intersection of two merged interval lists (linear sweep).

    Written for speed (it runs on the collector's thread for every step): no calls per pair.
    """
    i = j = 0
    covered = 0
    count_a, count_b = len(a), len(b)
    while i < count_a and j < count_b:
        a_start, a_end = a[i]
        b_start, b_end = b[j]
        start = a_start if a_start > b_start else b_start
        if a_end < b_end:
            if a_end > start:
                covered += a_end - start
            i += 1
        else:
            if b_end > start:
                covered += b_end - start
            j += 1
    return covered


def clip(intervals: Iterable[Interval], lo: int, hi: int) -> list[Interval]:
    """The parts of the intervals inside ``[lo, hi)`` (empty ones dropped)."""
    if hi <= lo:
        return []
    return [(s if s > lo else lo, e if e < hi else hi) for s, e in intervals if e > s and e > lo and s < hi]
