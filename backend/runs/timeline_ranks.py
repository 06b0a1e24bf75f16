"""Which ranks' spans a step's timeline carries: every rank of a small run; of a big one, each stage's
median and slowest rank (its data-parallel replicas folded), or the ranks the reader asks for.

The breakdown (one row per rank) always covers every rank: it is what finds the rank to drill into.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from bubblescope.analysis import RankBreakdown, median_and_slowest
from bubblescope.backend.errors import Invalid

FULL_TIMELINE_RANKS: Final = 64
"""Up to this many ranks, the timeline shows every rank; past it, two per stage unless asked."""
MAX_ASKED_RANKS: Final = 64
"""At most this many ranks' spans per answer (~100 spans per rank and step keep it well under 1 MB)."""
RANK_SPEC: Final = re.compile(r"^\d{1,9}(-\d{1,9})?(,\d{1,9}(-\d{1,9})?)*$")


@dataclass(frozen=True)
class TimelineRank:
    rank: int
    stage: int | None
    role: str  # "every rank", "asked", "slowest of N" or "median of N"


def parse_ranks(spec: str, world_size: int) -> list[int]:
    """``"0-7,341"`` → [0, ..., 7, 341]; refuses what is malformed, out of the world or too many."""
    text = spec.replace(" ", "")
    if not RANK_SPEC.match(text):
        raise Invalid("ranks", f"{spec[:40]!r} is not a rank list such as 0-7,341")
    chosen: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        first, last = int(low), int(high or low)
        if last < first:
            raise Invalid("ranks", f"the range {part} runs backwards")
        if last >= world_size:
            raise Invalid("ranks", f"rank {last} is not below the run's world_size {world_size}")
        if last - first + 1 + len(chosen) > MAX_ASKED_RANKS:
            raise Invalid("ranks", f"at most {MAX_ASKED_RANKS} ranks at a time")
        chosen.update(range(first, last + 1))
    return sorted(chosen)


def timeline_ranks(breakdowns: Sequence[RankBreakdown], asked: list[int] | None) -> list[TimelineRank]:
    stage_of = {b.rank: b.stage for b in breakdowns}
    if asked is not None:
        return [TimelineRank(rank, stage_of.get(rank), "asked") for rank in asked]
    if len(breakdowns) <= FULL_TIMELINE_RANKS:
        return [TimelineRank(b.rank, b.stage, "every rank") for b in sorted(breakdowns, key=lambda b: b.rank)]
    return [
        TimelineRank(rank, stage, role)
        for rank, stage, role in median_and_slowest((b.rank, b.stage, b.compute_ns) for b in breakdowns)
    ]
