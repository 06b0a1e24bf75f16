"""Async ops end when their work completes, and calls inside a communication span the job wrote
itself are not recorded twice: a real 2-rank gloo job (``parallel_job.py --mode=async``).

Each step (D = ``ASYNC_DELAY_S``, 100 ms): rank 1 waits on an ``irecv`` at once while rank 0 sleeps
D before its ``isend``, then computes D before waiting on that send; after a barrier, rank 0
posts an async all-reduce and computes 3D before waiting, while rank 1 joins it D late; then both run an
all-reduce and a broadcast inside their own ``collector.span``s, and an all-reduce inside a
compute span. The checks compare span ends with events on the other rank (aligned, within the
offset's uncertainty plus 1 ms) or with spans of the same rank (one clock), never with a
duration: a sleep never takes less than asked, and a loaded machine only delays events further.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.collector.parallel_job import ASYNC_DELAY_S
from tests.support import LiveServer, run_parallel_job, wait_for_steps

pytestmark = pytest.mark.slow
STEPS = 2
D = ASYNC_DELAY_S * 1e9
SLACK = 1_000_000  # ns beyond the stated clock uncertainty, for cross-rank comparisons


@pytest.fixture(scope="module")
def job(sqlite_server: LiveServer) -> dict[str, Any]:
    job = run_parallel_job(sqlite_server.url, "async", 2, f"--steps={STEPS}")
    assert job.returncode == 0, job.output[-3000:]
    with sqlite_server.client() as client:
        detail = wait_for_steps(client, job.run_key, ranks=2, steps=STEPS)
        steps = [client.get(f"/api/v1/runs/{job.run_key}/steps/{s}").json() for s in range(STEPS)]
    uncertainty = max(r["clock_uncertainty_ns"] for r in detail["ranks"])
    return {"steps": steps, "slack": uncertainty + SLACK}


def spans(detail: dict[str, Any], rank: int, kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [
        s for s in detail["spans"] if s["rank"] == rank and s["kind"] == kind and (name is None or s["name"] == name)
    ]


def one(detail: dict[str, Any], rank: int, kind: str, name: str | None = None) -> dict[str, Any]:
    found = spans(detail, rank, kind, name)
    assert len(found) == 1, (rank, kind, name, detail["spans"])
    return found[0]


def test_an_irecv_ends_when_its_data_arrived_not_when_it_was_posted(job: dict[str, Any]) -> None:
    """Rank 1's irecv is posted at the step's start and waited on at once; its data leaves rank 0
    only after rank 0 slept D. Ended at posting, the span would be microseconds long and end
    before the send began; it ends after the matching isend was posted on rank 0."""
    for detail in job["steps"]:
        received = one(detail, 1, "recv", "irecv")
        sent = one(detail, 0, "send", "isend")
        assert received["end_ns"] >= sent["start_ns"] - job["slack"], detail["step"]
        assert received["end_ns"] - received["start_ns"] >= D / 2, received  # the sleep it waited through
        assert received["bytes"] == 1024 * 4 and received["peer"] == 0


def test_an_isend_on_gloo_ends_at_its_wait_after_the_work_done_meanwhile(job: dict[str, Any]) -> None:
    """gloo's send works carry no completion time, so the span ends when ``wait`` returns: after
    the compute span that ran between posting and waiting (one rank, one clock: exact)."""
    for detail in job["steps"]:
        sent = one(detail, 0, "send", "isend")
        busy = one(detail, 0, "forward", "busy-send")
        assert sent["start_ns"] <= busy["start_ns"] and sent["end_ns"] >= busy["end_ns"], (sent, busy)


def test_an_async_all_reduce_ends_when_it_completes_between_posting_and_wait(job: dict[str, Any]) -> None:
    """Rank 0 posts the all-reduce, computes 3D, then waits; rank 1 joins D after it was posted.
    The span ends when the op completed: not before rank 1 joined (so not at posting), and well
    before rank 0's wait (so not at the wait): at least D before the compute span's end."""
    for detail in job["steps"]:
        posted = [s for s in spans(detail, 0, "all_reduce", "all_reduce") if s["bytes"] == 256 * 4]
        assert len(posted) == 1, detail["spans"]
        (reduced,) = posted
        joined = next(s for s in spans(detail, 1, "all_reduce", "all_reduce") if s["bytes"] == 256 * 4)
        busy = one(detail, 0, "backward", "busy-async")
        assert reduced["start_ns"] <= busy["start_ns"]
        assert reduced["end_ns"] >= joined["start_ns"] - job["slack"], (reduced, joined)
        assert reduced["end_ns"] <= busy["end_ns"] - D, (reduced, busy)


def test_calls_inside_a_communication_span_of_the_job_are_recorded_once_and_inside_compute_they_are_traced(
    job: dict[str, Any],
) -> None:
    """``with collector.span("all_reduce", ...): dist.all_reduce(y)`` is one span, the job's own
    (its name, group and bytes), not two; the same for a broadcast. An all-reduce inside a compute
    span is traced as usual: the compute span and the all-reduce, inside it."""
    for detail in job["steps"]:
        for rank in (0, 1):
            own = one(detail, rank, "all_reduce", "own-all-reduce")
            assert (own["group"], own["bytes"]) == ("mine", 64 * 4)
            inside = [
                s
                for s in detail["spans"]
                if s["rank"] == rank and s is not own and own["start_ns"] <= s["start_ns"] <= own["end_ns"]
            ]
            assert inside == [], inside
            assert [s["name"] for s in spans(detail, rank, "broadcast")] == ["own-broadcast"]
            around = one(detail, rank, "forward", "compute-around-comm")
            traced = [s for s in spans(detail, rank, "all_reduce", "all_reduce") if s["bytes"] == 8 * 4]
            assert len(traced) == 1, detail["spans"]
            assert around["start_ns"] <= traced[0]["start_ns"] <= traced[0]["end_ns"] <= around["end_ns"]
