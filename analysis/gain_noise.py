"""How sure a predicted gain is: an interval from the run's own step-to-step variation and the replay's error.

A fix is predicted from the analysed steps' medians. The interval's half-width is one step's own 95% range
(``spread.range95`` of the steps' wall times: 1.96 sigma from their MAD, which one slow step does not inflate; not
the median's standard error, which the run-to-run spread exceeds), plus, for a pipeline, the replay's measured
error (``BubbleAttribution.replay_excess_ns``: how much more the replay idles than was measured). A gain inside it
is ``within_noise``: listed, never the first thing to do. A run whose steps vary by 1% (a quiet GPU
job) has fixes of 2% offered; one whose steps vary by 5% (a loaded CPU) needs 10%. With fewer than two steps
there is no variation to measure and the run's report prices nothing (``run_report.MIN_ADVICE_STEPS``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Final

from bubblescope.analysis.suggestions import Suggestion

NOT_A_GAIN: Final = frozenset({"memory_pressure"})  # kinds whose point is memory, not time


def with_noise(suggestions: Sequence[Suggestion], noise_ns: float) -> list[Suggestion]:
    """Each suggestion with its interval's half-width and whether its gain clears it; those that do first, each
    part by predicted gain."""
    marked = [
        s
        if s.kind in NOT_A_GAIN
        else replace(s, gain_half_width_ns=noise_ns, within_noise=(s.current_step_ns - s.predicted_step_ns) <= noise_ns)
        for s in suggestions
    ]
    return sorted(marked, key=lambda s: (s.within_noise, -s.gain_fraction))
