"""Every torch.distributed.pipelining schedule, instrumented, on real 2-rank gloo jobs.

The looped and V-shaped schedules run two (virtual) stages per rank; each compute span carries
the virtual stage id of its action, and the zero-bubble schedules' input-gradient and
weight-gradient parts arrive as separate spans.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from bubblescope.analysis.schedules import SCHEDULES, lookup
from tests.support import LiveServer, run_pipeline_job, wait_for_steps

pytestmark = pytest.mark.slow
RANKS, MICROBATCHES, STEPS = 2, 4, 2
MULTI_STAGE = [schedule.name for schedule in SCHEDULES if schedule.placement != "single"]
# Schedules that always split the backward into input-gradient and weight-gradient actions.
ALWAYS_SPLIT = {"interleavedzb", "zbv"}
COMPUTE_KINDS = ("forward", "backward", "backward_input", "backward_weight")


def local_stage_indices(schedule: str, rank: int, ranks: int) -> list[int]:
    return lookup(schedule).local_stages(rank, ranks)


@pytest.fixture(scope="module")
def schedule_jobs(sqlite_server: LiveServer) -> dict[str, tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Per schedule: the run detail and each step's detail."""
    results = {}
    with sqlite_server.client() as client:
        for schedule in MULTI_STAGE:
            job = run_pipeline_job(
                sqlite_server.url, stages=RANKS, schedule=schedule, microbatches=MICROBATCHES, steps=STEPS, hidden=256
            )
            assert job.returncode == 0, (schedule, job.output[-3000:])
            detail = wait_for_steps(client, job.run_key, ranks=RANKS, steps=STEPS)
            steps = [client.get(f"/api/v1/runs/{job.run_key}/steps/{s['step']}").json() for s in detail["steps"]]
            results[schedule] = (detail, steps)
    return results


@pytest.mark.parametrize("schedule", MULTI_STAGE)
def test_run_and_ranks_record_the_schedule_and_every_virtual_stage(schedule_jobs: dict, schedule: str) -> None:
    detail, _steps = schedule_jobs[schedule]
    assert detail["config"]["schedule"] == lookup(schedule).torch_class
    assert detail["config"]["num_stages"] == 2 * RANKS
    assert detail["config"]["virtual_stages"] == 2
    for rank in detail["ranks"]:
        assert rank["stages"] == local_stage_indices(schedule, rank["rank"], RANKS)


@pytest.mark.parametrize("schedule", MULTI_STAGE)
def test_every_action_is_a_span_with_its_virtual_stage(schedule_jobs: dict, schedule: str) -> None:
    _detail, steps = schedule_jobs[schedule]
    for step in steps:
        for rank in range(RANKS):
            spans = [s for s in step["spans"] if s["rank"] == rank]
            for stage in local_stage_indices(schedule, rank, RANKS):
                kinds = Counter((s["kind"], s["microbatch"]) for s in spans if s["stage"] == stage)
                for j in range(MICROBATCHES):
                    assert kinds[("forward", j)] == 1, (schedule, rank, stage, j, kinds)
                    full, parts = kinds[("backward", j)], (kinds[("backward_input", j)], kinds[("backward_weight", j)])
                    # Each micro-batch's backward is one full backward, or exactly one of each part.
                    assert (full, parts) in ((1, (0, 0)), (0, (1, 1))), (schedule, stage, j, kinds)
                    if schedule in ALWAYS_SPLIT:
                        assert parts == (1, 1), (schedule, stage, j)


@pytest.mark.parametrize("schedule", MULTI_STAGE)
def test_cross_rank_transfers_are_recorded_per_virtual_stage(schedule_jobs: dict, schedule: str) -> None:
    """A recv for every stage input that lives on another rank, tagged with the receiving stage."""
    _detail, steps = schedule_jobs[schedule]
    placement = {stage: rank for rank in range(RANKS) for stage in local_stage_indices(schedule, rank, RANKS)}
    last = 2 * RANKS - 1
    for step in steps:
        received = Counter(
            (s["rank"], s["stage"], s["name"], s["peer"])
            for s in step["spans"]
            if s["kind"] == "recv" and s["name"] in ("fwd", "bwd")
        )  # not the warm-up exchanges
        expected: Counter = Counter()
        for stage, rank in placement.items():
            if stage > 0 and placement[stage - 1] != rank:
                expected[(rank, stage, "fwd", placement[stage - 1])] = MICROBATCHES
            if stage < last and placement[stage + 1] != rank:
                expected[(rank, stage, "bwd", placement[stage + 1])] = MICROBATCHES
        assert received == expected, schedule


@pytest.mark.parametrize("schedule", MULTI_STAGE)
def test_dependency_order_holds_across_virtual_stages(schedule_jobs: dict, schedule: str) -> None:
    """Forward of (stage s, j) starts after forward of (s-1, j) ends; the input gradient of (s, j)
    starts after that of (s+1, j) ends; on the aligned timeline, within the clock uncertainty."""
    detail, steps = schedule_jobs[schedule]
    slack = sum(r["clock_uncertainty_ns"] for r in detail["ranks"]) + 50_000
    for step in steps:
        starts: dict[tuple[str, int, int], int] = {}
        ends: dict[tuple[str, int, int], int] = {}
        for s in step["spans"]:
            kind = {"backward_input": "backward"}.get(s["kind"], s["kind"])
            if kind in ("forward", "backward"):
                starts[(kind, s["stage"], s["microbatch"])] = s["start_ns"]
                ends[(kind, s["stage"], s["microbatch"])] = s["end_ns"]
        for stage in range(1, 2 * RANKS):
            for j in range(MICROBATCHES):
                assert starts[("forward", stage, j)] >= ends[("forward", stage - 1, j)] - slack, (schedule, stage, j)
                assert starts[("backward", stage - 1, j)] >= ends[("backward", stage, j)] - slack, (schedule, stage, j)


@pytest.mark.parametrize("schedule", MULTI_STAGE)
def test_breakdown_adds_up_and_sends_do_not_hide_idle_time(schedule_jobs: dict, schedule: str) -> None:
    """The looped schedules wait on their sends only at the step's end; a send must not be
    counted as communication for the whole step: no send span covers the rank's own compute.
    (A recv may legitimately wait most of a step for a peer the loaded machine descheduled,
    so the rank's communication share is not bounded here.)"""
    _detail, steps = schedule_jobs[schedule]
    for step in steps:
        for b in step["breakdown"]:
            assert b["compute_ns"] + b["transfer_ns"] + b["dependency_wait_ns"] + b["idle_ns"] == b["window_ns"]
        assert max(b["bubble_ns"] for b in step["breakdown"]) > 0, schedule
        for rank in range(RANKS):
            spans = [s for s in step["spans"] if s["rank"] == rank]
            computing = [(s["start_ns"], s["end_ns"]) for s in spans if s["kind"] in COMPUTE_KINDS]
            sends = [s for s in spans if s["kind"] == "send"]
            assert sends and computing, (schedule, rank)
            for send in sends:
                covered = [c for c in computing if send["start_ns"] < c[0] and c[1] < send["end_ns"]]
                assert not covered, (schedule, rank, send, covered)
