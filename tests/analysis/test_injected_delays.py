"""The analysis recovers delays injected into a real job, by amounts that come from the injection.

The causes add up to the measured bubble by construction (the last one is the remainder), the
replay of the unchanged run matches it because one figure is fitted to make it so, and a rank's
idle time is its window less everything else. None of that says the figures are right. Here a
real 4-rank 1F1B job (``injected_job.py``, tiny layers) gets two known delays:

- stage 2 sleeps ``SLOW_MS`` in every forward (``--slow-stage``): compute of that stage;
- on steps ``PAUSED``, rank 0 sleeps ``PAUSE_MS`` at the step's start in no span (``--pause``):
  idle on rank 0, and the ranks downstream wait that much longer in their recvs;
- on steps ``LATE``, the last rank computes ``LATE_MS`` more before the step's closing all-reduce
  (``--late``): compute on that rank, and the others wait that much longer inside the all-reduce.

and each figure is checked against what the delay implies on its own. The expected values are
worked out from the injected delays alone (with the layers' own cost, ~0.5 ms per micro-batch,
as the only correction), and the margins are stated with each check. A sleep never takes less
than asked; on a loaded 2-core machine it can take longer, and other processes stretch single
steps by tens of milliseconds (one such step in a trial run took 266 ms against 130), so every
check reads medians over steps or micro-batches, never one step.
"""

from __future__ import annotations

import statistics
import uuid
from typing import Any

import pytest

from tests.support import LiveServer, run_torchrun, wait_for_steps

pytestmark = [pytest.mark.slow, pytest.mark.timing]

MS = 1e6
P, M = 4, 4  # ranks (one stage each), micro-batches
SLOW_STAGE, SLOW_MS = 2, 30.0
PAUSE_RANK, PAUSE_MS = 0, 100.0
LATE_RANK, LATE_MS = P - 1, 150.0  # well above a loaded machine's wake-up delay (~25 ms: see the late-rank test)
STEPS = 15
CLEAN = list(range(1, 6))  # no pause: the imbalance is read here (step 0 warms up)
PAUSED = [6, 8, 10]
LATE = [12, 13, 14]
UNPAUSED = [s for s in range(1, STEPS) if s not in PAUSED and s not in LATE]


@pytest.fixture(scope="module")
def job(sqlite_server: LiveServer) -> dict[str, Any]:
    run_key = f"injected-{uuid.uuid4().hex[:8]}"
    done = run_torchrun(
        sqlite_server.url,
        "tests/analysis/injected_job.py",
        P,
        f"--steps={STEPS}",
        f"--microbatches={M}",
        f"--slow-stage={SLOW_STAGE}:{SLOW_MS}",
        f"--pause={PAUSE_RANK}:{PAUSE_MS}:{','.join(map(str, PAUSED))}",
        f"--late={LATE_RANK}:{LATE_MS}:{','.join(map(str, LATE))}",
        run_key=run_key,
        extra_env={"BUBBLESCOPE_FLUSH_INTERVAL_S": "0.5"},
    )
    assert done.returncode == 0, done.output[-3000:]
    with sqlite_server.client() as client:
        wait_for_steps(client, run_key, P, STEPS)

        def analysis(first: int, last: int) -> dict[str, Any]:
            response = client.get(f"/api/v1/runs/{run_key}/analysis", params={"from_step": first, "to_step": last})
            assert response.status_code == 200, response.text
            return response.json()

        clean = analysis(CLEAN[0], CLEAN[-1])
        whatif = client.post(
            f"/api/v1/runs/{run_key}/whatif",
            json={"slowest_rank_to_median": True, "from_step": CLEAN[0], "to_step": CLEAN[-1]},
        )
        assert whatif.status_code == 200, whatif.text
        return {
            "key": run_key,
            "clean": clean,
            "whatif": whatif.json(),
            "per_step": {step: analysis(step, step) for step in range(1, STEPS)},
            "breakdowns": {
                step: {b["rank"]: b for b in client.get(f"/api/v1/runs/{run_key}/steps/{step}").json()["breakdown"]}
                for step in range(1, STEPS)
            },
            "spans": {step: client.get(f"/api/v1/runs/{run_key}/steps/{step}").json()["spans"] for step in LATE},
        }


def causes(analysis: dict[str, Any]) -> dict[str, float]:
    return {cause["name"]: cause["ns"] for cause in analysis["attribution"]["causes"]}


def median_over(steps: list[int], value: Any) -> float:
    return statistics.median(value(step) for step in steps)


def test_the_slow_stage_is_named_and_its_excess_is_the_injected_sleep(job: dict[str, Any]) -> None:
    """Stage costs are medians of forward + backward per micro-batch (20 each here); the slow
    stage's exceeds the others' median by the sleep: at least ``SLOW_MS`` less 1 ms (the other
    stages' own cost may exceed the slow one's by that), at most 10% + 1 ms more (oversleeping)."""
    analysis = job["clean"]
    costs = [c["forward_ns"] + c["backward_ns"] for c in analysis["pipeline"]["setup"]["stage_costs"]]
    others = statistics.median(c for s, c in enumerate(costs) if s != SLOW_STAGE)
    excess = costs[SLOW_STAGE] - others
    assert SLOW_MS * MS - 1 * MS <= excess <= 1.1 * SLOW_MS * MS + 1 * MS, [c / MS for c in costs]
    imbalance = analysis["imbalance"]
    assert imbalance["slowest_stage"] == SLOW_STAGE
    # slowest / mean - 1 with the others at their own cost and the slow one ``SLOW_MS`` above it
    implied = (others + SLOW_MS * MS) / (others + SLOW_MS * MS / P) - 1
    assert imbalance["slowest_excess"] == pytest.approx(implied, rel=0.05), (imbalance, implied)


def test_the_stage_imbalance_cause_is_what_the_slow_stage_makes_the_others_wait(job: dict[str, Any]) -> None:
    """With the layers' own cost negligible, the slow stage works M·D per step and the others
    wait for it: the mean idle over ranks is (P-1)/P·M·D, of which the schedule with every stage
    at the mean cost (D/P each) would leave (P-1)·D/P. The difference, (M-1)(P-1)·D/P = 67.5 ms,
    is the imbalance's share. Within 15%: the layers' own cost (~0.5 ms per action, 3% of D) and
    the replay's handling of it move it by a few percent (a 1-2 ms per action cost in a pure replay
    gives 41-44 ms of the 45 that the formula gives for D = 20 ms)."""
    expected = (M - 1) * (P - 1) * SLOW_MS * MS / P
    found = causes(job["clean"])
    assert found["stage_imbalance"] == pytest.approx(expected, rel=0.15), {k: v / MS for k, v in found.items()}
    assert found["stage_imbalance"] > 5 * abs(found["communication_wait"])


def test_making_the_slow_stage_median_is_predicted_to_save_its_sleep_on_every_micro_batch(
    job: dict[str, Any],
) -> None:
    """The what-if replay of the unchanged run matches the measured step by construction (its
    per-action overhead is fitted so). Changing the slowest rank to the median stage (the others'
    cost: P = 4 stages, one slow) removes the sleep from the one stage every micro-batch waits
    for, M·D = 120 ms a step: the predicted saving, within 15% (the same reasons as above)."""
    whatif = job["whatif"]
    saving = whatif["measured_step_ns"] - whatif["step_ns"]
    assert saving == pytest.approx(M * SLOW_MS * MS, rel=0.15), (whatif["measured_step_ns"] / MS, saving / MS)


def test_the_slow_stage_computes_its_sleep_on_every_micro_batch_in_each_steps_breakdown(job: dict[str, Any]) -> None:
    """Per step, the slow rank's compute exceeds the others' median compute by M·D (each forward
    sleeps D): at least M·D less 2 ms, at most 10% + 2 ms more, the median over the clean steps."""
    excess = median_over(
        CLEAN,
        lambda step: (
            job["breakdowns"][step][SLOW_STAGE]["compute_ns"]
            - statistics.median(b["compute_ns"] for r, b in job["breakdowns"][step].items() if r != SLOW_STAGE)
        ),
    )
    expected = M * SLOW_MS * MS
    assert expected - 2 * MS <= excess <= 1.1 * expected + 2 * MS, excess / MS


def test_a_pause_in_no_span_is_idle_on_its_rank_and_dependency_wait_downstream(job: dict[str, Any]) -> None:
    """On the paused steps rank 0 sleeps D before sending anything: its idle grows by D, and rank
    1's first recv waits D longer for rank 0's send (dependency wait; its other recvs wait for the
    slow stage as on every step). Compared with the steps without the pause, medians over steps:
    at least 70% of D (the unpaused steps spread by about ±5 ms in trial runs; loaded CI machines read
    88.6 and 76.0 ms of a 100-ms pause; counted as compute or a wait it would read 0), at most 40% more
    (oversleeping and scheduling delays of a loaded machine: rank 1's wait read 124.6 ms once; a pause counted
    twice would read 200)."""

    def delta(rank: int, field: str) -> float:
        value = lambda step: job["breakdowns"][step][rank][field]
        return median_over(PAUSED, value) - median_over(UNPAUSED, value)

    low, high = 0.7 * PAUSE_MS * MS, 1.4 * PAUSE_MS * MS
    idle, waited = delta(PAUSE_RANK, "idle_ns"), delta(PAUSE_RANK + 1, "dependency_wait_ns")
    assert low <= idle <= high, idle / MS
    assert low <= waited <= high, waited / MS
    # The pause is neither compute nor a wait on the paused rank itself. Rank 0's own waits (its
    # recvs of the slow stage's gradients) spread like any step's on a loaded machine: a median
    # of the 3 paused steps against the 8 unpaused moved by 10.4 ms in one CI run, so the bound is
    # a fifth of D; counting the pause as a wait would move it by all of D.
    assert abs(delta(PAUSE_RANK, "compute_ns")) < 0.05 * PAUSE_MS * MS
    assert abs(delta(PAUSE_RANK, "dependency_wait_ns")) < 0.2 * PAUSE_MS * MS


def test_an_all_reduce_waiting_on_a_late_rank_is_wait_on_the_others_and_compute_on_the_late_one(
    job: dict[str, Any],
) -> None:
    """On the late steps the last rank computes D more before the closing all-reduce: its compute grows
    by D, and every other rank sits in the all-reduce until it arrives, which is dependency wait (bubble),
    not transfer. The late rank's compute, medians over the late steps against the unpaused ones, within
    [0.9·D, 1.2·D] (a sleep never takes less); its own dependency wait moves by under a fifth of D (a loaded
    CI machine moved it by 10.6%; counted as its wait, its extra compute would move it by all of D). On each late
    step, each other rank's wait is at least the
    time from its own arrival at the closing all-reduce to the late rank's (less 2 ms), read from the
    step's aligned spans; that gap is most of D (how much of D a rank waited anyway depends on when it
    arrives, which the machine's load moves); their transfer moves within a quarter of D (counted as
    transfer, the wait would have moved it by all of D). D is 150 ms because the transfer after the late rank's
    arrival is not free of the machine's load: all four ranks wake at once on two cores, and a loaded CI
    machine moved one rank's transfer by 26.8 ms (median of the late steps) — 45% of the 60 ms D once used,
    18% of this one."""

    def delta(rank: int, field: str) -> float:
        value = lambda step: job["breakdowns"][step][rank][field]
        return median_over(LATE, value) - median_over(UNPAUSED, value)

    def arrival(step: int, rank: int) -> int:  # the closing all-reduce: the rank's last one of the step
        return max(s["start_ns"] for s in job["spans"][step] if s["rank"] == rank and s["kind"] == "all_reduce")

    computed = delta(LATE_RANK, "compute_ns")
    assert 0.9 * LATE_MS * MS <= computed <= 1.2 * LATE_MS * MS, computed / MS
    assert abs(delta(LATE_RANK, "dependency_wait_ns")) < 0.2 * LATE_MS * MS
    for rank in range(P - 1):
        for step in LATE:
            gap = arrival(step, LATE_RANK) - arrival(step, rank)
            assert gap >= 0.5 * LATE_MS * MS, (rank, step, gap / MS)
            waited = job["breakdowns"][step][rank]["dependency_wait_ns"]
            assert waited >= gap - 2 * MS, (rank, step, waited / MS, gap / MS)
        moved = delta(rank, "transfer_ns")
        assert abs(moved) < 0.25 * LATE_MS * MS, (rank, moved / MS)


def test_a_pause_outside_the_pipeline_is_straggler_jitter_not_imbalance(job: dict[str, Any]) -> None:
    """A step's pause stretches every rank's bubble by D (rank 0 sleeps, the others wait for it),
    and nothing the replay models moves: the stage costs, the transfer latency and the
    imbalance stay. So the straggler/jitter cause of a paused step exceeds that of an unpaused
    one by D: the medians over the steps of each kind, each step analysed on its own, within
    [0.9·D, 1.2·D] as above (trial runs: 98-100 ms for D = 100 ms); the imbalance cause moves by
    under 10% of D."""
    per_step = job["per_step"]
    jitter = median_over(PAUSED, lambda s: causes(per_step[s])["straggler_jitter"]) - median_over(
        UNPAUSED, lambda s: causes(per_step[s])["straggler_jitter"]
    )
    assert 0.9 * PAUSE_MS * MS <= jitter <= 1.2 * PAUSE_MS * MS, jitter / MS
    imbalance = median_over(PAUSED, lambda s: causes(per_step[s])["stage_imbalance"]) - median_over(
        UNPAUSED, lambda s: causes(per_step[s])["stage_imbalance"]
    )
    assert abs(imbalance) < 0.1 * PAUSE_MS * MS, imbalance / MS
