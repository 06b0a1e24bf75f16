"""Which of a run's steps are warm-up: the first few after the run's first step (compilation, allocator
warm-up, cold caches). Baselines, default steps, the analysis and the dashboard's step time leave them
out, and partial steps (not every rank reported: a crash, or batches still arriving) too."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, NamedTuple

WARMUP_STEPS: Final = 5
BASELINE_STEPS: Final = 50  # a run's baseline step time: the median of this many steps after the warm-up


def warmup_until(first_step: int | None) -> int | None:
    """The first step past the warm-up (None: the run has no step yet)."""
    return None if first_step is None else first_step + WARMUP_STEPS


def is_warmup(step: int, first_step: int | None) -> bool:
    """Whether ``step`` is warm-up in a run whose first step is ``first_step``."""
    until = warmup_until(first_step)
    return until is not None and step < until


class StepSeen(NamedTuple):
    """What a run's summary knows of one of its steps."""

    step: int
    ranks_reported: int
    wall_ns: int
    has_spans: bool


def is_complete(step: StepSeen, world_size: int) -> bool:
    """Every rank reported the step: not a crashed run's last, nor one still arriving."""
    return step.ranks_reported >= world_size


def usual_steps(steps: Sequence[StepSeen], world_size: int, skip_warmup: bool = True) -> list[StepSeen]:
    """The steps with spans that stand for the run, in step order: the complete ones past the warm-up;
    where there are none, the complete ones past the first step, else the complete ones, else all.
    ``skip_warmup=False``: complete ones, else all (a range the caller chose keeps its warm-up)."""
    with_spans = sorted((s for s in steps if s.has_spans), key=lambda s: s.step)
    complete = [s for s in with_spans if is_complete(s, world_size)]
    pools = [complete, with_spans]
    if skip_warmup and steps:
        first = min(s.step for s in steps)
        pools[:0] = [[s for s in complete if not is_warmup(s.step, first)], [s for s in complete if s.step > first]]
    return next((pool for pool in pools if pool), [])


def default_step(steps: Sequence[StepSeen], world_size: int, running: bool) -> int | None:
    """The step a run page opens on: of ``usual_steps``, the newest while the run runs, else the one whose
    wall time is nearest the median (a finished run's outlier is not the default), the newer on a tie."""
    pool = usual_steps(steps, world_size)
    if not pool:
        return None
    if running:
        return pool[-1].step
    middle = sorted(s.wall_ns for s in pool)[(len(pool) - 1) // 2]
    return min(pool, key=lambda s: (abs(s.wall_ns - middle), -s.step)).step
