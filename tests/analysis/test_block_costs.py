"""Per-block costs on plain spans: sums per step, medians over steps and ranks, the slowest rank, the share."""

from __future__ import annotations

import pytest

from bubblescope import wire
from bubblescope.analysis.block_costs import block_costs
from bubblescope.analysis.model import TimedSpan

MS = 1_000_000


def step(rank_costs: dict[int, list[tuple[int, int]]], model_ms: int, calls: int = 1) -> list[TimedSpan]:
    """Each rank: the model's forward+backward of ``model_ms``, and per block (forward ms, backward ms) split
    into ``calls`` calls, laid out one after another."""
    spans = []
    for rank, blocks in rank_costs.items():
        spans.append(TimedSpan(rank, "forward", 0, model_ms * MS // 2, name="Net"))
        spans.append(TimedSpan(rank, "backward", model_ms * MS // 2, model_ms * MS, name="Net"))
        at = 0
        for _ in range(calls):
            for index, (forward, backward) in enumerate(blocks):
                name = wire.block_span_name("Net", f"layers.{index}")
                for kind, length in (("forward", forward), ("backward", backward)):
                    spans.append(TimedSpan(rank, kind, at, at + length * MS // calls, name=name))
                    at += length * MS // calls
        spans.append(TimedSpan(rank, "all_reduce", at, at + MS, group="dp"))
    return spans


def test_no_block_spans_no_costs() -> None:
    assert block_costs([step({0: []}, 10)]) == []


def test_a_block_slow_on_one_rank_names_that_rank_and_the_median_stays_the_others() -> None:
    usual = [(2, 4), (6, 12)]
    slow = [(2, 4), (12, 24)]
    steps = [step({0: usual, 1: usual, 2: slow}, 24) for _ in range(3)]
    first, second = block_costs(steps)
    assert (first.block, second.block) == ("layers.0", "layers.1")  # the order they ran forward
    assert (second.forward_ns, second.backward_ns) == (6 * MS, 12 * MS)
    assert second.slowest_rank == 2 and second.slowest_ns == 36 * MS
    assert second.share_of_model == pytest.approx(18 / 24) and first.share_of_model == pytest.approx(6 / 24)
    assert first.slowest_ns == 6 * MS  # a tie: the lowest rank
    assert first.slowest_rank == 0


def test_several_calls_a_step_add_up_and_one_slow_step_does_not_move_the_median() -> None:
    steps = [step({0: [(3, 6)]}, 10, calls=3) for _ in range(4)] + [step({0: [(30, 60)]}, 10)]
    (cost,) = block_costs(steps)
    assert cost.forward_ns == pytest.approx(3 * MS, abs=2) and cost.backward_ns == pytest.approx(6 * MS, abs=2)
