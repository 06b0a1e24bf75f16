"""``bubblescope demo`` sizes itself to the machine: no more stages (processes) than cores, at least 2, and says why
in one line when it lowers the count; as many micro-batches as stages unless asked; what is asked is kept."""

from __future__ import annotations

import argparse

import pytest

from bubblescope.analysis import lookup
from bubblescope.demo import DEFAULT_STAGES, size_to_machine


def asked(stages: int | None = None, microbatches: int | None = None, schedule: str = "1f1b") -> argparse.Namespace:
    return argparse.Namespace(stages=stages, microbatches=microbatches, schedule=schedule)


@pytest.mark.parametrize("cores,stages", [(1, 2), (2, 2), (3, 3), (4, 4), (64, DEFAULT_STAGES)])
def test_stages_follow_the_cores(cores: int, stages: int) -> None:
    args = asked()
    note = size_to_machine(args, cores)
    assert (args.stages, args.microbatches) == (stages, stages)
    if stages < DEFAULT_STAGES:
        assert note is not None and f"{stages} stages, not {DEFAULT_STAGES}" in note and f"{cores} core" in note
        assert "--stages" in note
    else:
        assert note is None


@pytest.mark.parametrize(
    "schedule,microbatches", [("naive", 1), ("gpipe", 2), ("interleaved1f1b", 2), ("dualpipev", 4)]
)
def test_micro_batches_default_to_what_the_schedule_runs(schedule: str, microbatches: int) -> None:
    """One per stage, or what the schedule needs (torch refuses fewer than its stages): the demo starts, not exit 2."""
    args = asked(schedule=schedule)
    size_to_machine(args, 2)
    assert args.microbatches == microbatches
    kind = lookup(schedule)
    assert kind.shape_problem(args.stages, args.microbatches, kind.default_stages_per_rank) is None


def test_what_is_asked_is_kept_and_not_explained() -> None:
    args = asked(stages=4, microbatches=8)
    assert size_to_machine(args, 2) is None
    assert (args.stages, args.microbatches) == (4, 8)
