"""The alert rules: what pages the on-call engineer, from a snapshot of one run (pure; no I/O).

``RULES`` are the service's own alerts: each the registry's entry (``alert_catalog``: name, severity,
what it means, what to do; docs/alerts.md is generated from them) with its judge, the function that
reads a ``RunSnapshot`` and returns the alerts that fire now. The service builds the snapshot
(``backend/alerts/evaluator.py``) and keeps the alerts (opens, updates, resolves); here is only the judgement.

Culprits. A failed run names the rank that failed first on the aligned clock, unless its error is
the kind a rank dies of when another rank vanished (a broken connection, a timed-out collective,
a termination signal): then the culprit is the rank that went quiet first without reporting any
end (killed: SIGKILL, the out-of-memory killer, a lost host), with its host and last step. A hung
run names the ranks the others wait for: those outside any collective (in their own code), those
no longer heard from, and the peers the blocked receives wait on.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bubblescope.analysis.alert_catalog import (
    BUBBLE_ABOVE_FLOOR,
    CATALOG,
    COLLECTOR_DROPPING,
    RUN_FAILED,
    RUN_HUNG,
    RUN_SILENT,
    STEP_TIME_REGRESSION,
    STRAGGLER,
    AlertSpec,
    Thresholds,
)

HUNG_STEP_FACTOR = 5.0  # a hang is at least this many usual steps without progress
LISTED_RANKS = 8  # ranks spelled out in a description; the rest are counted
COLLATERAL_ERROR = re.compile(
    r"connection (reset|closed|refused)|broken pipe|closed by peer|remote process|peer (process|rank)"
    r"|timed? ?out|timeout|aborted|sigterm|terminated|signal 15|socket|NCCL (error|communicator)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class RankStatus:
    """A rank as the rules see it: how it ended, when it was last heard, what it is blocked in."""

    rank: int
    outcome: str | None  # "finished" / "failed" / None: no end reported
    error: str | None = None
    end_ns: int | None = None  # when it ended, rank 0's clock
    ended_at: datetime | None = None  # when the end was received (service clock)
    last_heard_at: datetime | None = None
    host: str = ""
    stage: int | None = None
    last_step: int | None = None
    in_flight: dict[str, Any] | None = None  # the collector watchdog's report (wire's in_flight)
    pid: int | None = None  # its process on ``host``, as it registered


@dataclass(frozen=True)
class StragglerFinding:
    kind: str  # "slow rank" | "slow host" | "slow stage" | "slow replica"
    ranks: list[int]
    hosts: list[str]
    stage: int | None
    message: str


@dataclass(frozen=True)
class BubbleFigures:
    measured_fraction: float  # the median step's
    floor_fraction: float  # the simulator's floor for the measured stage costs
    step_fractions: list[float]  # each step's measured bubble, oldest first
    action: str | None  # the advisor's first suggestion


@dataclass(frozen=True)
class RegressionFigures:
    baseline_step_s: float
    window_medians_s: list[float]  # consecutive parts of the recent window, oldest first
    window_s: float  # how long the window covers


@dataclass(frozen=True)
class RunSnapshot:
    key: str
    state: str  # running / finished / failed / silent
    state_detail: str
    now: datetime
    quiet_s: float  # since anything was heard from the run
    ranks: Sequence[RankStatus]
    world_size: int
    usual_step_s: float | None  # recent median step
    progress_quiet_s: float | None  # since a batch with steps last came (None: no step yet)
    dropped_spans: int = 0
    dropping: bool = False  # dropped spans grew lately
    stragglers: Sequence[StragglerFinding] = ()
    bubble: BubbleFigures | None = None
    regression: RegressionFigures | None = None


@dataclass(frozen=True)
class FiringAlert:
    alertname: str
    severity: str
    summary: str
    description: str
    action: str
    evidence: str  # the dashboard view: "" (the run page) or "?view=..." / "#..." after it
    labels: dict[str, str] = field(default_factory=dict)  # rank / host / stage when it names one


Judge = Callable[[RunSnapshot, Thresholds], list[FiringAlert]]


def _fire(
    spec: AlertSpec,
    summary: str,
    description: str,
    evidence: str,
    labels: dict[str, str],
    action: str | None = None,
) -> FiringAlert:
    """``spec``'s alert, firing with these figures; ``action``: a run's own next step (else the registry's)."""
    return FiringAlert(
        spec.alertname, spec.severity or "warning", summary, description, action or spec.action, evidence, labels
    )


@dataclass(frozen=True)
class Rule:
    alertname: str
    severity: str
    meaning: str
    action: str
    judge: Judge


def _seconds(value: float) -> str:
    if value < 120:
        return f"{value:.0f} s"
    if value < 7200:
        return f"{value / 60:.0f} min"
    return f"{value / 3600:.1f} h"


def _where(rank: RankStatus) -> str:
    parts = [f"host {rank.host}"] if rank.host else []
    parts += [f"stage {rank.stage}"] if rank.stage is not None else []
    parts.append(f"last step {rank.last_step}" if rank.last_step is not None else "no step finished")
    return f"rank {rank.rank} ({', '.join(parts)})"


def _rank_labels(rank: RankStatus) -> dict[str, str]:
    labels = {"rank": str(rank.rank), "host": rank.host}
    if rank.stage is not None:
        labels["stage"] = str(rank.stage)
    return labels


def _listed(texts: Sequence[str]) -> str:
    shown = "; ".join(texts[:LISTED_RANKS])
    return shown + (f"; and {len(texts) - LISTED_RANKS} more" if len(texts) > LISTED_RANKS else "")


def is_collateral(error: str | None) -> bool:
    """An error a rank dies of when another rank vanished, not a cause of its own."""
    return error is not None and COLLATERAL_ERROR.search(error) is not None


def first_failures(ranks: Sequence[RankStatus], world_size: int) -> list[RankStatus]:
    """The failed ranks of the world, first on the aligned clock first (no end time: last, by rank)."""
    return sorted(
        (r for r in ranks if r.outcome == "failed" and r.rank < world_size),
        key=lambda r: (r.end_ns is None, r.end_ns or 0, r.rank),
    )


def vanished_first(ranks: Sequence[RankStatus], world_size: int, now: datetime) -> RankStatus | None:
    """When the first failure is collateral: the rank that went quiet first without any end, before
    the failures were reported (killed), or None."""
    failed = first_failures(ranks, world_size)
    if not failed or not is_collateral(failed[0].error):
        return None
    cutoff = min((r.ended_at for r in failed if r.ended_at is not None), default=now)
    vanished = [
        r
        for r in ranks
        if r.outcome is None and r.rank < world_size and (r.last_heard_at is None or r.last_heard_at <= cutoff)
    ]
    return min(vanished, key=lambda r: (r.last_heard_at is not None, r.last_heard_at or now, r.rank), default=None)


def failure_culprit(ranks: Sequence[RankStatus], world_size: int, now: datetime) -> tuple[RankStatus, str] | None:
    """The rank a failed run is blamed on, and why (see the module's docstring)."""
    failed = first_failures(ranks, world_size)
    if not failed:
        return None
    first = failed[0]
    killed = vanished_first(ranks, world_size, now)
    if killed is not None:
        return killed, (
            f"{_where(killed)} went quiet without reporting an end: killed (SIGKILL, the out-of-memory killer) "
            f"or its host was lost; then rank {first.rank} failed: {first.error}"
        )
    others = len(failed) - 1
    then = f" (then {others} other rank{'s' if others > 1 else ''} failed)" if others else ""
    return first, f"{_where(first)} failed first: {first.error or 'no error text'}{then}"


def failed_rule(snapshot: RunSnapshot, _t: Thresholds) -> list[FiringAlert]:
    if snapshot.state != "failed":
        return []
    found = failure_culprit(snapshot.ranks, snapshot.world_size, snapshot.now)
    if found is None:
        return []
    culprit, why = found
    process = f" (PID {culprit.pid})" if culprit.pid is not None else ""
    action = (
        f"Read rank {culprit.rank}'s log first, on host {culprit.host}{process}: the other ranks' errors are usually "
        "its consequence. If it left no error (killed), check that host's kernel log for the OOM killer "
        "(dmesg | grep -i oom) and the scheduler's record of the job."
    )
    return [
        _fire(
            RUN_FAILED,
            f"Run {snapshot.key} failed on rank {culprit.rank} (host {culprit.host})",
            why,
            "#ranks",
            _rank_labels(culprit),
            action,
        )
    ]


def _blocked_text(rank: RankStatus, extra_s: float) -> str:
    report = rank.in_flight or {}
    op = report.get("op")
    where = f"step {report.get('step')}" if report.get("in_step", True) else f"after step {report.get('step', 1) - 1}"
    if not op:
        return f"rank {rank.rank} (host {rank.host}) is in {where} outside any collective for " + _seconds(
            float(report.get("elapsed_s", 0)) + extra_s
        )
    peer = f" with rank {op['peer']}" if op.get("peer") is not None else ""
    group = f" on group {op['group']}" if op.get("group") else ""
    name = f" '{op['name']}'" if op.get("name") else ""
    return (
        f"rank {rank.rank} waits in {op['kind']}{name}{peer}{group} in {where} for "
        f"{_seconds(float(op.get('elapsed_s', 0)) + extra_s)}"
    )


def hung_lagging(
    ranks: Sequence[RankStatus], world_size: int, now: datetime, alive_within_s: float
) -> tuple[list[RankStatus], list[RankStatus]]:
    """(the ranks the others wait for, the ranks blocked waiting) of a stalled run: the one definition the hung
    state, the hung alert and the run page read."""
    live = [r for r in ranks if r.outcome is None and r.rank < world_size]
    heard = [
        r for r in live if r.last_heard_at is not None and (now - r.last_heard_at).total_seconds() <= alive_within_s
    ]
    quiet = [r for r in live if r not in heard]
    blocked = [r for r in heard if r.in_flight and r.in_flight.get("op")]
    free = [r for r in heard if r.in_flight and not r.in_flight.get("op")]
    peers = {
        int(r.in_flight["op"]["peer"]) for r in blocked if r.in_flight and r.in_flight["op"].get("peer") is not None
    }
    by_rank = {r.rank: r for r in live}
    waited_on = [by_rank[p] for p in sorted(peers) if p in by_rank and by_rank[p] not in blocked]
    lagging = {r.rank: r for r in [*free, *quiet, *waited_on]}
    if not lagging and live:  # everyone blocked: the ranks furthest behind
        lowest = min((r.last_step if r.last_step is not None else -1) for r in live)
        lagging = {r.rank: r for r in live if (r.last_step if r.last_step is not None else -1) == lowest}
    return sorted(lagging.values(), key=lambda r: r.rank), [r for r in blocked if r.rank not in lagging]


def _age(snapshot: RunSnapshot, moment: datetime) -> float:
    return max(0.0, (snapshot.now - moment).total_seconds())


def hung_rule(snapshot: RunSnapshot, t: Thresholds) -> list[FiringAlert]:
    if snapshot.state not in ("running", "hung", "silent") or snapshot.progress_quiet_s is None:
        return []
    usual = snapshot.usual_step_s or 0.0
    threshold = max(t.hung_after_s, HUNG_STEP_FACTOR * usual)
    reporting = [r for r in snapshot.ranks if r.in_flight and r.outcome is None]
    if snapshot.progress_quiet_s < threshold or not reporting:
        return []
    lagging, blocked = hung_lagging(snapshot.ranks, snapshot.world_size, snapshot.now, t.silent_after_s)
    lag_texts = []
    for rank in lagging:
        if rank.in_flight and rank.last_heard_at is not None and _age(snapshot, rank.last_heard_at) <= t.silent_after_s:
            lag_texts.append(_blocked_text(rank, _age(snapshot, rank.last_heard_at)))
        else:
            heard = (
                "never heard from"
                if rank.last_heard_at is None
                else "not heard from for " + _seconds(_age(snapshot, rank.last_heard_at))
            )
            lag_texts.append(f"{_where(rank)} is {heard}")
    wait_texts = [_blocked_text(r, _age(snapshot, r.last_heard_at)) for r in blocked if r.last_heard_at is not None]
    labels = _rank_labels(lagging[0]) if len(lagging) == 1 else {}
    who = lagging_who(lagging)
    description = (
        f"No rank finished a step for {_seconds(snapshot.progress_quiet_s)} (usual step {usual:.3g} s). "
        f"Lagging: {_listed(lag_texts)}."
    )
    if wait_texts:
        description += f" Waiting on them: {_listed(wait_texts)}."
    return [
        _fire(
            RUN_HUNG,
            f"Run {snapshot.key} is hung: the others wait for {who}",
            description,
            "?view=hung#ranks",
            labels,
            _hung_action(lagging),
        )
    ]


def lagging_who(lagging: Sequence[RankStatus]) -> str:
    """How the hung state, its alert and the page name the ranks the others wait for: "rank 1 (host h)", or
    "3 ranks (1, 4, 7)" (the first eight listed)."""
    if len(lagging) == 1:
        return f"rank {lagging[0].rank} (host {lagging[0].host})"
    listed = ", ".join(str(r.rank) for r in lagging[:8]) + (", ..." if len(lagging) > 8 else "")
    return f"{len(lagging)} ranks ({listed})"


def _hung_action(lagging: list[RankStatus]) -> str | None:
    """The runbook's first step with each lagging rank's host and PID filled in (None: none is known)."""
    known = [r for r in lagging if r.pid is not None][:4]
    if not known:
        return None
    dumps = "; ".join(f"on host {r.host}: py-spy dump --pid {r.pid} (rank {r.rank})" for r in known)
    more = f", and the other {len(lagging) - len(known)} lagging ranks" if len(lagging) > len(known) else ""
    whose = "rank's" if len(lagging) == 1 else "ranks'"
    return (
        f"Dump the lagging {whose} Python stack ({dumps}{more}) and look for a "
        "deadlock, a stuck data loader or I/O, or a collective it never entered; then restart from the last checkpoint."
    )


def silent_rule(snapshot: RunSnapshot, _t: Thresholds) -> list[FiringAlert]:
    if snapshot.state != "silent":
        return []
    open_ranks = [r for r in snapshot.ranks if r.outcome is None and r.rank < snapshot.world_size]
    first = min(
        open_ranks,
        key=lambda r: (r.last_heard_at is not None, r.last_heard_at or snapshot.now, r.rank),
        default=None,
    )
    named = f" The first to go quiet: {_where(first)}." if first is not None else ""
    return [
        _fire(
            RUN_SILENT,
            f"Run {snapshot.key}: nothing heard for {_seconds(snapshot.quiet_s)}",
            f"{snapshot.state_detail}.{named}",
            "#ranks",
            {},
        )
    ]


def straggler_rule(snapshot: RunSnapshot, _t: Thresholds) -> list[FiringAlert]:
    if snapshot.state != "running":
        return []
    alerts = []
    for finding in snapshot.stragglers:
        labels: dict[str, str] = {}
        if finding.kind == "slow rank" and len(finding.ranks) == 1:
            labels["rank"] = str(finding.ranks[0])
        if len(finding.hosts) == 1:
            labels["host"] = finding.hosts[0]
        if finding.stage is not None:
            labels["stage"] = str(finding.stage)
        if finding.kind == "slow replica":
            labels["ranks"] = ",".join(str(r) for r in finding.ranks[:16])
        alerts.append(
            _fire(
                STRAGGLER,
                f"Run {snapshot.key}: persistent {finding.kind}",
                finding.message,
                "#stragglers",
                labels,
            )
        )
    return alerts


def regression_rule(snapshot: RunSnapshot, t: Thresholds) -> list[FiringAlert]:
    figures = snapshot.regression
    if snapshot.state != "running" or figures is None or not figures.window_medians_s:
        return []
    limit = figures.baseline_step_s * (1 + t.regression_percent / 100)
    if figures.window_s < t.regression_for_s or min(figures.window_medians_s) <= limit:
        return []
    recent = figures.window_medians_s[-1]
    slower = (recent / figures.baseline_step_s - 1) * 100
    return [
        _fire(
            STEP_TIME_REGRESSION,
            f"Run {snapshot.key}: steps {slower:.0f}% slower than its baseline",
            f"The median step is {recent:.3g} s against the run's baseline of {figures.baseline_step_s:.3g} s, "
            f"above {t.regression_percent:.0f}% slower throughout the last {_seconds(figures.window_s)}.",
            "#stragglers",
            {},
        )
    ]


def bubble_rule(snapshot: RunSnapshot, t: Thresholds) -> list[FiringAlert]:
    figures = snapshot.bubble
    if snapshot.state != "running" or figures is None:
        return []
    above = (figures.measured_fraction - figures.floor_fraction) * 100
    least_above = (min(figures.step_fractions, default=0.0) - figures.floor_fraction) * 100
    if len(figures.step_fractions) < t.bubble_for_steps or least_above <= t.bubble_over_floor_points:
        return []  # for Y steps: in each of them (a host's hiccup in some steps is jitter, not a pattern)
    return [
        _fire(
            BUBBLE_ABOVE_FLOOR,
            f"Run {snapshot.key}: pipeline bubble {above:.0f} points above its floor",
            f"The measured bubble is {figures.measured_fraction:.0%} of the median step, and at least "
            f"{min(figures.step_fractions):.0%} in each of the newest {len(figures.step_fractions)} steps with spans; "
            f"the simulator's floor for this schedule and these stage costs is {figures.floor_fraction:.0%}.",
            "#analysis",
            {},
            figures.action,
        )
    ]


def dropping_rule(snapshot: RunSnapshot, _t: Thresholds) -> list[FiringAlert]:
    if not snapshot.dropping or snapshot.state != "running":
        return []
    return [
        _fire(
            COLLECTOR_DROPPING,
            f"Run {snapshot.key}: the collector is dropping data",
            f"{snapshot.dropped_spans:,} spans dropped so far, and more lately: a full queue or spool, or the "
            "service refusing batches. Timelines and the analysis miss them; step aggregates still arrive.",
            "",
            {},
        )
    ]


JUDGES: dict[str, Judge] = {
    RUN_FAILED.alertname: failed_rule,
    RUN_HUNG.alertname: hung_rule,
    RUN_SILENT.alertname: silent_rule,
    STRAGGLER.alertname: straggler_rule,
    STEP_TIME_REGRESSION.alertname: regression_rule,
    BUBBLE_ABOVE_FLOOR.alertname: bubble_rule,
    COLLECTOR_DROPPING.alertname: dropping_rule,
}
RULES: tuple[Rule, ...] = tuple(
    Rule(spec.alertname, spec.severity or "warning", spec.meaning, spec.action, JUDGES[spec.alertname])
    for spec in CATALOG
    if spec.by_service
)
RULE_NAMES: frozenset[str] = frozenset(rule.alertname for rule in RULES)


def evaluate(snapshot: RunSnapshot, thresholds: Thresholds) -> list[FiringAlert]:
    """Every alert that fires for the run now (a healthy run: none)."""
    firing: list[FiringAlert] = []
    for rule in RULES:
        if rule.alertname not in thresholds.disabled:
            firing.extend(rule.judge(snapshot, thresholds))
    return firing


def alerts_table() -> str:
    """The Markdown table of docs/alerts.md."""
    rows = ["| alert | severity | when it fires | what to do |", "|---|---|---|---|"]
    rows += [f"| `{r.alertname}` | {r.severity} | {r.meaning} | {r.action} |" for r in RULES]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(alerts_table(), end="")
