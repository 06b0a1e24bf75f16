"""Which of a run's steps are warm-up: the first few after the run's first step (compilation, allocator
warm-up, cold caches). Baselines, default steps and the dashboard's step time leave them out."""

from __future__ import annotations

from typing import Final

WARMUP_STEPS: Final = 5
BASELINE_STEPS: Final = 50  # a run's baseline step time: the median of this many steps after the warm-up


def warmup_until(first_step: int | None) -> int | None:
    """The first step past the warm-up (None: the run has no step yet)."""
    return None if first_step is None else first_step + WARMUP_STEPS
