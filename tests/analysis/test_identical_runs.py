"""Two identical real jobs (the demo pipeline, 2 stages, 1F1B, 4 micro-batches, as a user would run it twice)
get one verdict: the same first thing to do, or both "within noise" (each predicted gain carries an interval from
the run's own step-to-step variation and the replay's error), and the same simulated floor within 3 points.

The floor is one method now (the replayed pipeline step's idle share at the measured stage costs); it was the
same idle over each run's own step, which read 21.8%, 3.7% and 4.9% for three such runs. What still moves is the
measured stage costs' ratio (the last stage's loss weighs 10-20% more from run to run on this loaded 2-core
CPU): pairs of runs here read 22.4/24.3, 24.1/20.8, 22.9/21.3, 24.4/24.7 and 21.9/24.4%. The issue's 1 point is
not met on this machine."""

from __future__ import annotations

from typing import Any

import pytest

from tests.analysis.replay_support import JobShape, run_and_analyse
from tests.support import LiveServer

pytestmark = pytest.mark.slow
SHAPE = JobShape("1f1b", 4, (2, 2), steps=16)


def first_call_to_act(analysis: dict[str, Any]) -> str | None:
    return next((s["kind"] for s in analysis["suggestions"] if not s["within_noise"]), None)


def test_two_identical_jobs_get_the_same_floor_and_the_same_first_suggestion(sqlite_server: LiveServer) -> None:
    client = sqlite_server.client()
    answers = [run_and_analyse(sqlite_server.url, client, SHAPE)[1] for _ in range(2)]
    floors = [a["attribution"]["simulated_floor_fraction"] for a in answers]
    detail = [
        (
            a["attribution"]["simulated_floor_fraction"],
            [
                (s["kind"], round(s["gain_fraction"], 4), round(s["gain_half_width_ns"] / 1e6, 2), s["within_noise"])
                for s in a["suggestions"]
            ],
        )
        for a in answers
    ]
    assert abs(floors[0] - floors[1]) <= 0.03, detail
    assert first_call_to_act(answers[0]) == first_call_to_act(answers[1]), detail
    for analysis in answers:
        for s in analysis["suggestions"]:
            gain = s["current_step_ns"] - s["predicted_step_ns"]
            assert s["kind"] == "memory_pressure" or s["within_noise"] == (gain <= s["gain_half_width_ns"]), s
            assert s["kind"] == "memory_pressure" or s["gain_half_width_ns"] > 0, s  # 16 steps vary: never exactly 0
