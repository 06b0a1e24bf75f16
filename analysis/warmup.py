"""Which of a run's steps are warm-up: the first few after the run's first step (compilation, allocator
warm-up, cold caches). Baselines, default steps, the analysis and the dashboard's step time leave them
out, and partial steps (not every rank reported: a crash, or batches still arriving) too."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, NamedTuple

from bubblescope import wire

WARMUP_STEPS: Final = 5
BASELINE_STEPS: Final = 50  # a run's baseline step time: the median of this many steps after the warm-up


def imported_ranks(config: Mapping[str, Any] | None) -> list[int] | None:
    """The ranks a run imported from profiler traces holds (``wire.IMPORTED_FROM``); None for a collected run."""
    source = (config or {}).get(wire.IMPORTED_FROM)
    ranks = source.get("ranks") if isinstance(source, dict) else None
    return [r for r in ranks if isinstance(r, int)] if isinstance(ranks, list) else None


def warmup_steps_of(config: Mapping[str, Any] | None) -> int:
    """A run's warm-up steps: ``WARMUP_STEPS``, or none for a run imported from profiler traces (the profiler's
    schedule records active steps only, after its own wait and warm-up)."""
    return 0 if imported_ranks(config) is not None else WARMUP_STEPS


def reporting_ranks(world_size: int, config: Mapping[str, Any] | None) -> int:
    """How many ranks report a complete step: the world, or the ranks a run imported from traces holds (a 128-rank
    job's two sampled traces)."""
    imported = imported_ranks(config)
    return world_size if imported is None else len(imported)


def warmup_until(first_step: int | None, warmup_steps: int = WARMUP_STEPS) -> int | None:
    """The first step past the warm-up (None: the run has no step yet)."""
    return None if first_step is None else first_step + warmup_steps


def is_warmup(step: int, first_step: int | None, warmup_steps: int = WARMUP_STEPS) -> bool:
    """Whether ``step`` is warm-up in a run whose first step is ``first_step``."""
    until = warmup_until(first_step, warmup_steps)
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


def usual_steps(
    steps: Sequence[StepSeen], world_size: int, skip_warmup: bool = True, warmup_steps: int = WARMUP_STEPS
) -> list[StepSeen]:
    """The steps with spans that stand for the run, in step order: the complete ones past the warm-up;
    where there are none, the complete ones past the first step, else the complete ones, else all.
    ``skip_warmup=False``: complete ones, else all (a range the caller chose keeps its warm-up)."""
    with_spans = sorted((s for s in steps if s.has_spans), key=lambda s: s.step)
    complete = [s for s in with_spans if is_complete(s, world_size)]
    pools = [complete, with_spans]
    if skip_warmup and warmup_steps and steps:
        first = min(s.step for s in steps)
        past = [s for s in complete if not is_warmup(s.step, first, warmup_steps)]
        pools[:0] = [past, [s for s in complete if s.step > first]]
    return next((pool for pool in pools if pool), [])


def default_step(
    steps: Sequence[StepSeen], world_size: int, running: bool, warmup_steps: int = WARMUP_STEPS
) -> int | None:
    """The step a run page opens on: of ``usual_steps``, the newest while the run runs, else the one whose
    wall time is nearest the median (a finished run's outlier is not the default), the newer on a tie."""
    pool = usual_steps(steps, world_size, warmup_steps=warmup_steps)
    if not pool:
        return None
    if running:
        return pool[-1].step
    middle = sorted(s.wall_ns for s in pool)[(len(pool) - 1) // 2]
    return min(pool, key=lambda s: (abs(s.wall_ns - middle), -s.step)).step
