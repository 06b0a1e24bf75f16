"""A run's state, read from what its ranks reported: running, hung, finished, failed or silent.

- **failed**: a rank reported that it ended on an uncaught exception (the collector notes it on
  the way out). Wins over everything else. The detail names the culprit as the failed alert does
  (``analysis.alert_rules.failure_culprit``): the rank that failed first on the aligned clock,
  unless that failure is a broken connection or a termination and a rank went quiet before it
  without any end: that one was killed.
- **finished**: every rank of the world reported a clean end (``collector.shutdown()``, which
  also runs at interpreter exit).
- **hung**: not ended, and a rank heard from within ``silent_after_s`` carries the collector watchdog's report
  of a step running far past its usual length (``in_flight``: 10 s and 3 usual steps by default). The
  detail names the rank(s) the others wait for, as the hung alert does (``analysis.hung_lagging``). It
  returns to running when steps arrive again (the next batch with steps clears the report).
- **silent**: not ended, and nothing heard from any rank for ``silent_after_s``: killed
  (SIGKILL, out of memory), hung (a collective that never completes), or cut off from the
  service. Also a long pause with no steps (evaluation, checkpointing), which the detail says.
- **running**: otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from bubblescope.analysis import (
    RankStatus,
    failure_culprit,
    first_failures,
    hung_lagging,
    imported_ranks,
    lagging_who,
    vanished_first,
)
from bubblescope.backend.db.timestamps import as_utc

RunStateName = Literal["running", "hung", "finished", "failed", "silent"]
OPEN_STATES: tuple[RunStateName, ...] = ("running", "hung")
"""The states of a run that has not ended and is still heard from."""
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
    world_size: int,
    ranks: Sequence[RankEnd],
    last_contact: datetime,
    now: datetime,
    silent_after_s: float,
    config: Mapping[str, Any] | None = None,
) -> RunState:
    """The state by the rule above; a rank at or above ``world_size`` (registered before the run's
    latest registration shrank it) is not part of the world and does not count. A run imported from traces
    (``config``) is finished once the ranks it imported are: the job's other ranks were never meant to report."""
    imported = imported_ranks(config)
    if imported is not None:
        done = {r.rank for r in ranks if r.outcome == "finished"}
        if done >= set(imported):
            listed = ", ".join(map(str, imported[:8])) + (", ..." if len(imported) > 8 else "")
            return RunState(
                "finished",
                f"imported from profiler traces: rank{'s' if len(imported) > 1 else ''} {listed} of {world_size}",
            )
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
    hung = _hung(ranks, world_size, as_utc(now), silent_after_s)
    if hung is not None and quiet_s < silent_after_s:
        return RunState("hung", hung + ended)
    if quiet_s >= silent_after_s:
        open_ranks = world_size - len(finished)
        return RunState(
            "silent",
            f"nothing heard for {_duration(quiet_s)}, and {open_ranks} of {world_size} ranks never reported an "
            f"end: killed, hung, paused without steps, or cut off from the service{ended}",
        )
    return RunState("running", f"last heard {_duration(max(0.0, quiet_s))} ago{ended}")


def _hung(ranks: Sequence[RankEnd], world_size: int, now: datetime, alive_within_s: float) -> str | None:
    """The hung detail when the watchdog of a rank heard from lately reports a step running long; else None."""
    reporting = [
        r
        for r in ranks
        if r.outcome is None
        and r.in_flight
        and r.last_heard_at is not None
        and (now - as_utc(r.last_heard_at)).total_seconds() <= alive_within_s
    ]
    if not reporting:
        return None
    lagging, _blocked = hung_lagging(ranks, world_size, now, alive_within_s)
    elapsed = max(  # as of each report, plus the time since it arrived
        float(r.in_flight.get("elapsed_s", 0.0)) + (now - as_utc(r.last_heard_at)).total_seconds()
        for r in reporting
        if r.in_flight and r.last_heard_at is not None
    )
    step = max(int(r.in_flight.get("step", 0)) for r in reporting if r.in_flight)
    return f"step {step} has run for {_duration(elapsed)}: the others wait for {lagging_who(lagging)}"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"
