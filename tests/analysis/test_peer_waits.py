"""Waiting for peers outside pipeline recvs (analysis/collective_waits.py, breakdown.send_waits): the part of
a collective before its last participant arrived, and of a send before its receiver posted the recv, is
dependency wait (bubble); the rest is transfer."""

from __future__ import annotations

from bubblescope.analysis.breakdown import send_waits, step_breakdown
from bubblescope.analysis.collective_waits import collective_waits
from bubblescope.analysis.model import TimedSpan


def reduce(rank: int, start: int, end: int, group: str = "world") -> TimedSpan:
    return TimedSpan(rank, "all_reduce", start, end, group=group)


def by_rank(spans: list[TimedSpan], coords: dict[int, dict[str, int]] | None = None) -> dict[int, tuple[int, int]]:
    """Each rank's (dependency wait, transfer) over a 0-100 window."""
    ranks = sorted({s.rank for s in spans})
    found = step_breakdown(spans, dict.fromkeys(ranks, (0, 100)), dict.fromkeys(ranks), coords=coords)
    return {b.rank: (b.dependency_wait_ns, b.transfer_ns) for b in found}


def test_a_collective_is_a_wait_until_its_last_participant_arrives() -> None:
    spans = [reduce(0, 0, 40), reduce(1, 10, 40), reduce(2, 30, 40)]
    assert collective_waits(spans, {}) == {0: [(0, 30)], 1: [(10, 30)]}
    assert by_rank(spans) == {0: (30, 10), 1: (20, 10), 2: (0, 10)}
    # the late rank computed until it arrived: compute there, not a wait
    late_compute = [*spans, TimedSpan(2, "backward", 0, 30)]
    assert by_rank(late_compute)[2] == (0, 10)


def test_calls_pair_in_order_within_each_mesh_group_and_other_groups_do_not_count() -> None:
    coords = {r: {"pp": r // 2, "dp": r % 2} for r in range(4)}  # dp groups {0, 1} and {2, 3}
    spans = [
        reduce(0, 0, 20, "dp"),
        reduce(1, 15, 20, "dp"),  # first call: rank 0 waits 15
        reduce(0, 50, 70, "dp"),
        reduce(1, 40, 70, "dp"),  # second: rank 1 waits 10
        reduce(2, 0, 90, "dp"),
        reduce(3, 80, 90, "dp"),  # the other group's lateness is its own
    ]
    assert collective_waits(spans, coords) == {0: [(0, 15)], 1: [(40, 50)], 2: [(0, 80)]}


def test_calls_that_cannot_be_paired_stay_transfer() -> None:
    unknown = [reduce(0, 0, 40, "experts"), reduce(1, 30, 40, "experts")]  # who else is in it: not known
    assert collective_waits(unknown, {}) == {}
    uneven = [reduce(0, 0, 40), reduce(0, 50, 60), reduce(1, 30, 40)]  # a call missing on rank 1
    assert collective_waits(uneven, {}) == {}
    assert by_rank(uneven)[0] == (0, 50)
    alone = [reduce(0, 0, 40)]
    assert collective_waits(alone, {}) == {}


def test_a_send_waits_for_its_receiver_only_when_it_outlasts_the_posted_recv() -> None:
    blocking = [TimedSpan(0, "send", 0, 50, peer=1, microbatch=0), TimedSpan(1, "recv", 20, 50, peer=0, microbatch=0)]
    assert send_waits(blocking) == {0: [(0, 20)]}
    assert by_rank(blocking) == {0: (20, 30), 1: (0, 30)}
    buffered = [TimedSpan(0, "send", 0, 5, peer=1, microbatch=0), TimedSpan(1, "recv", 20, 25, peer=0, microbatch=0)]
    assert send_waits(buffered) == {}  # it finished before the receiver came: nothing waited
    unmatched = [TimedSpan(0, "send", 0, 50, peer=1, microbatch=3), TimedSpan(1, "recv", 20, 50, peer=0, microbatch=0)]
    assert send_waits(unmatched) == {}
