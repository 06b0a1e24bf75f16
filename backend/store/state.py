"""A run's state, read from what its ranks reported: running, finished, failed or silent.

- **failed**: a rank reported that it ended on an uncaught exception (the collector notes it on
  the way out). Wins over everything else. The detail names the culprit as the failed alert does
  (``analysis.alert_rules.failure_culprit``): the rank that failed first on the aligned clock,
  unless that failure is a broken connection or a termination and a rank went quiet before it
  without any end: that one was killed.
- **finished**: every rank of the world reported a clean end (``collector.shutdown()``, which
  also runs at interpreter exit).
- **silent**: not ended, and nothing heard from any rank for ``silent_after_s``: killed
  (SIGKILL, out of memory), hung (a collective that never completes), or cut off from the
  service. Also a long pause with no steps (evaluation, checkpointing), which the detail says.
- **running**: otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from bubblescope.analysis import RankStatus, failure_culprit, first_failures, vanished_first
from bubblescope.backend.db.timestamps import as_utc

RunStateName = Literal["running", "finished", "failed", "silent"]
RankOutcome = Literal["finished", "failed"]


RankEnd = RankStatus
"""How a rank ended, and what names it when a failure is blamed on it (the alert rules' type)."""


@dataclass(frozen=True)
class RunState:
    state: RunStateName
    detail: str


def rank_outcome(stored: str | None) -> RankOutcome | None:
    """A stored outcome as its type (the column holds only what the end endpoint accepted)."""
    if stored == "finished":
        return "finished"
    if stored == "failed":
        return "failed"
    return None


def run_state(
    world_size: int, ranks: Sequence[RankEnd], last_contact: datetime, now: datetime, silent_after_s: float
) -> RunState:
    """The state by the rule above; a rank at or above ``world_size`` (registered before the run's
    latest registration shrank it) is not part of the world and does not count."""
    ranks = [r for r in ranks if r.rank < world_size]
    failed = first_failures(ranks, world_size)
    if failed:
        aware = as_utc(now)
        killed = failure_culprit(ranks, world_size, aware) if vanished_first(ranks, world_size, aware) else None
        if killed is not None:  # the first failure is a broken connection: a rank vanished before it
            return RunState("failed", killed[1])
        first = failed[0]
        if len(failed) == 1:
            return RunState("failed", f"rank {first.rank} failed: {first.error or 'no error text'}")
        others = ", ".join(str(r.rank) for r in failed[1:])
        return RunState(
            "failed",
            f"rank {first.rank} failed first: {first.error or 'no error text'} "
            f"(then rank{'s' if len(failed) > 2 else ''} {others})",
        )
    finished = {r.rank for r in ranks if r.outcome == "finished"}
    if len(finished) >= world_size:
        return RunState("finished", f"all {world_size} ranks finished")
    quiet_s = (as_utc(now) - as_utc(last_contact)).total_seconds()
    ended = f"; {len(finished)} of {world_size} ranks finished" if finished else ""
    if quiet_s >= silent_after_s:
        open_ranks = world_size - len(finished)
        return RunState(
            "silent",
            f"nothing heard for {_duration(quiet_s)}, and {open_ranks} of {world_size} ranks never reported an "
            f"end: killed, hung, paused without steps, or cut off from the service{ended}",
        )
    return RunState("running", f"last heard {_duration(max(0.0, quiet_s))} ago{ended}")


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"
