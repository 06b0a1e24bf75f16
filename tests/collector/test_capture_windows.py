"""CaptureWindows: the step ranges a rank learned to capture (pure logic, no I/O)."""

from __future__ import annotations

from bubblescope.collector.capture import MAX_WINDOWS, CaptureWindows


def covered(windows: CaptureWindows, steps: range) -> list[int]:
    return [step for step in steps if windows.covers(step)]


def test_a_request_covers_exactly_its_range() -> None:
    windows = CaptureWindows()
    windows.learn({"captures": [{"id": 1, "from_step": 40, "steps": 5}]})
    assert covered(windows, range(100)) == [40, 41, 42, 43, 44]


def test_a_rank_already_past_from_step_captures_what_remains() -> None:
    windows = CaptureWindows()
    windows.shipped_through(42)  # steps up to 42 already left without spans
    windows.learn({"captures": [{"id": 1, "from_step": 40, "steps": 5}]})
    assert covered(windows, range(43, 100)) == [43, 44]


def test_windows_behind_the_rank_are_forgotten_and_not_relearned() -> None:
    windows = CaptureWindows()
    windows.learn({"captures": [{"id": 1, "from_step": 10, "steps": 5}, {"id": 2, "from_step": 30, "steps": 5}]})
    windows.shipped_through(14)
    assert len(windows) == 1
    windows.learn({"captures": [{"id": 1, "from_step": 10, "steps": 5}]})  # an old batch's answer
    assert len(windows) == 1 and covered(windows, range(100)) == [30, 31, 32, 33, 34]


def test_the_number_of_windows_is_bounded() -> None:
    windows = CaptureWindows()
    for request_id in range(3 * MAX_WINDOWS):
        windows.learn({"captures": [{"id": request_id, "from_step": 1000 + request_id, "steps": 1}]})
    assert len(windows) == MAX_WINDOWS


def test_malformed_answers_are_ignored() -> None:
    windows = CaptureWindows()
    for junk in (
        "x",
        None,
        5,
        {"id": 1, "from_step": 3, "steps": 5},
        [None, 3.5, "x"],
        [{"id": "1", "from_step": 3, "steps": 5}],
        [{"id": 1, "from_step": -1, "steps": 5}],
        [{"id": 1, "from_step": 3, "steps": True}],
        [{"id": 1, "from_step": 3, "steps": 0}],
        [{"id": 1, "from_step": 2**70, "steps": 1}],
    ):
        windows.learn({"captures": junk})
    assert len(windows) == 0
