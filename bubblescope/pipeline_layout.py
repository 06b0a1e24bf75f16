"""Which pipeline stages a rank holds, and the torch schedule for them, by short schedule name.

``single`` schedules run one stage per rank; ``loop`` schedules hold stages r, r+p, r+2p, ...;
``v`` schedules (ZB-V, DualPipeV) hold exactly two, r and 2p-1-r, so the first and last
stage sit on rank 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

SCHEDULES: Final = {
    "gpipe": ("ScheduleGPipe", "single"),
    "1f1b": ("Schedule1F1B", "single"),
    "interleaved1f1b": ("ScheduleInterleaved1F1B", "loop"),
    "loopedbfs": ("ScheduleLoopedBFS", "loop"),
    "interleavedzb": ("ScheduleInterleavedZeroBubble", "loop"),
    "zbv": ("ScheduleZBVZeroBubble", "v"),
    "dualpipev": ("ScheduleDualPipeV", "v"),
}


def local_stage_indices(schedule: str, rank: int, world: int, per_rank: int | None = None) -> list[int]:
    """The stage indices ``rank`` holds under ``schedule`` with ``per_rank`` stages per rank."""
    _class_name, style = SCHEDULES[schedule]
    if style == "single":
        if per_rank not in (None, 1):
            raise ValueError(f"stages_per_rank: {schedule} runs one stage per rank, got {per_rank}")
        return [rank]
    if style == "v":
        if per_rank not in (None, 2):
            raise ValueError(f"stages_per_rank: {schedule} runs exactly two stages per rank, got {per_rank}")
        return [rank, 2 * world - 1 - rank]
    count = 2 if per_rank is None else per_rank
    if count < 1:
        raise ValueError(f"stages_per_rank: must be >= 1, got {count}")
    return [rank + world * local for local in range(count)]


def build_schedule(schedule: str, stages: list[Any], microbatches: int, loss_fn: Callable[..., Any]) -> Any:
    """The torch.distributed.pipelining schedule object for ``stages`` (this rank's)."""
    from torch.distributed import pipelining

    class_name, style = SCHEDULES[schedule]
    schedule_class = getattr(pipelining.schedules, class_name)
    if style == "single":
        return schedule_class(stages[0], n_microbatches=microbatches, loss_fn=loss_fn)
    return schedule_class(stages, n_microbatches=microbatches, loss_fn=loss_fn)
