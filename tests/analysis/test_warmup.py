"""Which steps stand for a run (analysis/warmup.py): the run page's default step and the analysis' window
leave out the warm-up and the partial steps (a crash, or batches still arriving) wherever others exist."""

from __future__ import annotations

from bubblescope.analysis.warmup import StepSeen, default_step, usual_steps

WORLD = 4


def steps(
    walls_ms: list[int], partial: set[int] = frozenset(), without_spans: set[int] = frozenset()
) -> list[StepSeen]:
    return [
        StepSeen(i, WORLD - 1 if i in partial else WORLD, ms * 1_000_000, i not in without_spans)
        for i, ms in enumerate(walls_ms)
    ]


def test_the_usual_steps_are_complete_and_past_the_warm_up() -> None:
    seen = steps([900, 500, 110, 100, 100, 100, 105, 95, 1600], partial={8}, without_spans={6})
    assert [s.step for s in usual_steps(seen, WORLD)] == [5, 7]
    assert [s.step for s in usual_steps(seen, WORLD, skip_warmup=False)] == [0, 1, 2, 3, 4, 5, 7]


def test_a_short_run_falls_back_to_complete_steps_past_the_first_then_to_any() -> None:
    assert [s.step for s in usual_steps(steps([900, 100, 100], partial={2}), WORLD)] == [1]
    assert [s.step for s in usual_steps(steps([900], partial={0}), WORLD)] == [0]  # only a partial one: shown
    assert usual_steps(steps([900, 100], without_spans={0, 1}), WORLD) == []


def test_the_warm_up_counts_from_the_runs_first_step() -> None:
    resumed = [StepSeen(100 + i, WORLD, 100_000_000, True) for i in range(7)]
    assert [s.step for s in usual_steps(resumed, WORLD)] == [105, 106]


def test_a_running_run_opens_on_its_newest_usual_step_a_finished_one_on_its_median() -> None:
    seen = steps([900, 500, 110, 100, 100, 100, 130, 98, 101, 400, 1600], partial={10})
    assert default_step(seen, WORLD, running=True) == 9  # newest complete; the partial 10 is not shown
    # finished: walls of 5..9 are 100, 130, 98, 101, 400 -> median 101 -> step 8, not the 400-ms outlier
    assert default_step(seen, WORLD, running=False) == 8
    tie = steps([900, 500, 110, 100, 100, 100, 102, 100, 102])  # median 100: steps 5 and 7, the newer
    assert default_step(tie, WORLD, running=False) == 7
    assert default_step([], WORLD, running=False) is None
