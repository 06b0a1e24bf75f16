"""Pure analysis: interval arithmetic, dependency waits, breakdown identities, closed forms."""

from __future__ import annotations

import random

import pytest

from bubblescope import intervals
from bubblescope.analysis.breakdown import dependency_waits, matched_recvs, step_breakdown, step_bubble
from bubblescope.analysis.model import TimedSpan
from bubblescope.analysis.schedules import closed_form_bubble


def test_union_and_intersection() -> None:
    merged = intervals.merge([(5, 10), (0, 3), (2, 4), (10, 12), (7, 7)])
    assert merged == [(0, 4), (5, 12)]
    assert intervals.union_length([(0, 10), (5, 15)]) == 15
    assert intervals.intersect_length([(0, 4), (5, 12)], [(3, 6), (11, 20)]) == 1 + 1 + 1
    assert intervals.clip([(0, 10), (20, 30)], 5, 25) == [(5, 10), (20, 25)]


def _covered(spans: list[tuple[int, int]], lo: int, hi: int) -> set[int]:
    """Brute force: the integer instants inside ``[lo, hi)`` that some span covers."""
    return {t for start, end in spans for t in range(max(start, lo), min(end, hi))}


def test_interval_arithmetic_agrees_with_counting_instants() -> None:
    generator = random.Random(7)
    for _ in range(400):
        a = [(s, s + generator.randint(-3, 15)) for s in (generator.randint(0, 60) for _ in range(8))]
        b = [(s, s + generator.randint(-3, 15)) for s in (generator.randint(0, 60) for _ in range(8))]
        lo, hi = generator.randint(-5, 40), generator.randint(-5, 80)
        clipped_a = intervals.merge(intervals.clip(a, lo, hi))
        clipped_b = intervals.merge(intervals.clip(b, lo, hi))
        assert intervals.total_length(clipped_a) == len(_covered(a, lo, hi))
        assert intervals.intersect_length(clipped_a, clipped_b) == len(_covered(a, lo, hi) & _covered(b, lo, hi))
        assert all(lo <= start < end <= hi for start, end in intervals.clip(a, lo, hi))


def test_recv_before_the_matching_send_is_dependency_wait_and_the_rest_transfer() -> None:
    spans = [
        TimedSpan(0, "forward", 0, 100, 0, 0),
        TimedSpan(0, "send", 100, 102, 0, 0, peer=1, name="fwd"),
        TimedSpan(1, "recv", 10, 120, 1, 0, peer=0, name="fwd"),  # waits 90 for the send, 20 transfer
        TimedSpan(1, "forward", 120, 220, 1, 0),
    ]
    assert dependency_waits(matched_recvs(spans)) == {1: [(10, 100)]}
    windows = {0: (0, 102), 1: (0, 220)}
    rank0, rank1 = step_breakdown(spans, windows, {0: 0, 1: 1})
    # idle is the window's remainder; idle and dependency wait against sleeps injected into a real
    # job: tests/analysis/test_injected_delays.py
    assert rank1.dependency_wait_ns == 90 and rank1.transfer_ns == 20 and rank1.idle_ns == 10
    assert rank1.bubble_ns == 100 and rank1.bubble_fraction == pytest.approx(100 / 220)
    assert rank0.compute_ns == 100 and rank0.transfer_ns == 2 and rank0.dependency_wait_ns == 0
    bubble = step_bubble([rank0, rank1], windows, "ScheduleGPipe", 2, 1)
    assert bubble.wall_ns == 220
    assert bubble.measured_fraction == pytest.approx(((220 - 102) / 220 + (220 - 120) / 220) / 2)
    assert bubble.theoretical_fraction == pytest.approx(0.5)


def test_unmatched_recv_counts_as_transfer_and_overlap_is_not_exposed() -> None:
    spans = [
        TimedSpan(0, "recv", 0, 50, peer=3, name="fwd"),
        TimedSpan(0, "forward", 40, 100),
        TimedSpan(0, "all_reduce", 60, 120),
    ]
    (only,) = step_breakdown(spans, {0: (0, 130)}, {})
    assert only.dependency_wait_ns == 0
    assert only.compute_ns == 60 and only.comm_ns == 110 and only.overlapped_comm_ns == 50
    assert only.exposed_comm_ns == 60 and only.transfer_ns == 60 and only.idle_ns == 10


@pytest.mark.parametrize(
    "schedule,p,m,v,expected",
    [
        ("ScheduleGPipe", 4, 8, 1, 3 / 11),
        ("Schedule1F1B", 2, 4, 1, 1 / 5),
        ("ScheduleInterleaved1F1B", 4, 8, 2, 1.5 / 9.5),
        ("naive", 4, 1, 1, 3 / 4),
    ],
)
def test_closed_forms(schedule: str, p: int, m: int, v: int, expected: float) -> None:
    floor = closed_form_bubble(schedule, p, m, v)
    assert floor is not None and floor.fraction == pytest.approx(expected)


def test_unknown_schedule_has_no_closed_form() -> None:
    assert closed_form_bubble("ScheduleDualPipeV", 4, 8) is None
    assert closed_form_bubble(None, 4, 8) is None
