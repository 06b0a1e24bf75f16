"""Identical real jobs (the demo pipeline, 2 stages, 1F1B, 4 micro-batches, as a user would run it twice) get
one verdict: the same first thing to do, or both "within noise" (each predicted gain carries an interval from
the run's own step-to-step variation and the replay's error), and the same simulated floor.

The floor is one method (the replayed pipeline step's idle share at the measured stage costs); it was the idle
over each run's own step, which read 21.8%, 3.7% and 4.9% for three such runs. It follows the measured stage
costs' ratio and nothing else, so it is held within 1 point on jobs whose stage work is steady, as a GPU's is
(each layer's device time asleep, ``--device-ms``): six such runs read 20.2-20.5%. The same jobs computing on
this loaded 2-core CPU vary their own stage-cost ratio between runs (0.97 to 1.63 in twelve runs on 2026-11-27),
and the floor rightly follows it (20.0-30.0%): ``bench/floor_spread.py`` prints both side by side."""

from __future__ import annotations

from typing import Any

import pytest

from tests.analysis.replay_support import JobShape, run_and_analyse
from tests.support import LiveServer

pytestmark = [pytest.mark.slow, pytest.mark.timing]
CPU_SHAPE = JobShape("1f1b", 4, (2, 2), steps=16)
STEADY_SHAPE = JobShape("1f1b", 4, (2, 2), hidden=256, steps=16, device_ms=3.0)


def first_call_to_act(analysis: dict[str, Any]) -> str | None:
    return next((s["kind"] for s in analysis["suggestions"] if not s["within_noise"]), None)


def verdict(analysis: dict[str, Any]) -> tuple[float, list[tuple[str, float, float, bool]]]:
    """What a failure prints: the floor and each suggestion's (kind, gain, half-width in ms, within noise)."""
    return (
        analysis["attribution"]["simulated_floor_fraction"],
        [
            (s["kind"], round(s["gain_fraction"], 4), round(s["gain_half_width_ns"] / 1e6, 2), s["within_noise"])
            for s in analysis["suggestions"]
        ],
    )


def assert_gains_are_judged_by_their_interval(analysis: dict[str, Any]) -> None:
    for s in analysis["suggestions"]:
        gain = s["current_step_ns"] - s["predicted_step_ns"]
        assert s["kind"] == "memory_pressure" or s["within_noise"] == (gain <= s["gain_half_width_ns"]), s
        assert s["kind"] == "memory_pressure" or s["gain_half_width_ns"] > 0, s  # 16 steps vary: never exactly 0


def test_two_identical_demo_jobs_get_the_same_first_suggestion(sqlite_server: LiveServer) -> None:
    client = sqlite_server.client()
    answers = [run_and_analyse(sqlite_server.url, client, CPU_SHAPE)[1] for _ in range(2)]
    assert first_call_to_act(answers[0]) == first_call_to_act(answers[1]), [verdict(a) for a in answers]
    for analysis in answers:
        assert_gains_are_judged_by_their_interval(analysis)


def test_identical_jobs_with_steady_stage_work_get_floors_within_one_point(sqlite_server: LiveServer) -> None:
    client = sqlite_server.client()
    answers = [run_and_analyse(sqlite_server.url, client, STEADY_SHAPE)[1] for _ in range(3)]
    floors = [a["attribution"]["simulated_floor_fraction"] for a in answers]
    detail = [verdict(a) for a in answers]
    assert max(floors) - min(floors) <= 0.01, detail
    assert all(0.19 <= floor <= 0.25 for floor in floors), detail  # closed form 20%; the last stage's loss adds
    # the interleaved schedule's gain (6-11% here) sits at the edge of its interval (5-13 ms of a 100 ms step), so
    # one run may offer it and another list it as within noise; no two runs may tell a person to do different things
    assert len({first_call_to_act(a) for a in answers} - {None}) <= 1, detail
    for analysis in answers:
        assert_gains_are_judged_by_their_interval(analysis)
