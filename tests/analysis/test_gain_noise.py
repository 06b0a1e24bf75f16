"""The interval on a predicted gain, on plain numbers: one step's 95% range from the steps' MAD, which one slow step
does not inflate; gains inside it are within noise and listed after those that clear it."""

from __future__ import annotations

import pytest

from bubblescope.analysis.gain_noise import with_noise
from bubblescope.analysis.spread import range95
from bubblescope.analysis.suggestions import Suggestion

MS = 1_000_000


def fix(kind: str, gain_ms: float, step_ms: float = 100.0) -> Suggestion:
    return Suggestion(
        kind=kind,
        title=kind,
        evidence="",
        current_step_ns=step_ms * MS,
        predicted_step_ns=(step_ms - gain_ms) * MS,
        predicted_bubble_fraction=None,
        gain_fraction=gain_ms / step_ms,
        memory_cost="none",
        apply={},
        torch_pipelining=None,
        torchtitan={},
        megatron=[],
    )


def test_one_slow_step_does_not_widen_the_interval() -> None:
    steady = [100 * MS + d * MS for d in (-2, -1, 0, 1, 2, -1, 1, 0)]
    assert range95(steady) == pytest.approx(1.96 * 1.4826 * 1 * MS)
    assert range95([*steady, 400 * MS]) == pytest.approx(range95(steady))
    assert range95([100 * MS]) == 0.0  # nothing to measure a spread on


def test_gains_inside_the_interval_are_within_noise_and_listed_last() -> None:
    noise = 3 * MS
    marked = with_noise([fix("small", 2.0), fix("large", 10.0), fix("medium", 4.0), fix("memory_pressure", 0.0)], noise)
    assert [(s.kind, s.within_noise) for s in marked] == [
        ("large", False),
        ("medium", False),
        ("memory_pressure", False),  # a memory note: no gain to weigh
        ("small", True),
    ]
    assert all(s.gain_half_width_ns == noise for s in marked if s.kind != "memory_pressure")
