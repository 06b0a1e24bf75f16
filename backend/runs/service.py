"""Run registration and the read views: run list, run detail, one step's timeline."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_
from sqlalchemy.orm import Session

from bubblescope import analysis, wire
from bubblescope.backend.db.models import RankInfo, Run
from bubblescope.backend.db.timestamps import as_utc
from bubblescope.backend.derived.steps import read_step
from bubblescope.backend.errors import Conflict, Invalid, NotFound, TooLarge
from bubblescope.backend.runs.schemas import (
    RankBreakdownOut,
    RankEndIn,
    RankOut,
    RankRegistration,
    RunDetail,
    RunRegistration,
    RunSummary,
    SpanOut,
    StepBubbleOut,
    StepDetail,
    StepSummary,
    TimelineRankOut,
)
from bubblescope.backend.runs.timeline_ranks import parse_ranks, timeline_ranks
from bubblescope.backend.settings import ServiceSettings
from bubblescope.backend.store import ranks as rank_queries, runs as run_queries, steps as step_queries
from bubblescope.backend.store.runs import require_run
from bubblescope.backend.store.state import OPEN_STATES, RankEnd, rank_outcome, run_state
from bubblescope.backend.store.step_read import spans_of_ranks
from bubblescope.trace_import import merged_source

MAX_CONFIG_DEPTH = 8


def config_check(settings: ServiceSettings) -> Callable[[dict[str, Any]], None]:
    """The bounds of a run's merged config: keys, nesting, bytes as JSON (docs/limits.md)."""

    def check(config: dict[str, Any]) -> None:
        if len(config) > settings.max_config_keys:
            raise TooLarge(
                "config", f"{len(config)} keys (merged with the run's) exceed the limit of {settings.max_config_keys}"
            )
        deep = _deeper_than(config, MAX_CONFIG_DEPTH)
        if deep is not None:
            raise Invalid(("config", *deep), f"nested deeper than {MAX_CONFIG_DEPTH} levels")
        size = len(json.dumps(config, separators=(",", ":")))
        if size > settings.max_config_bytes:
            raise TooLarge(
                "config",
                f"{size} bytes of JSON (merged with the run's) exceed the limit of {settings.max_config_bytes}",
            )

    return check


def _deeper_than(value: Any, limit: int) -> tuple[str | int, ...] | None:
    """The path of a container nested more than ``limit`` levels down, or None."""
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), value)]
    while stack:
        path, item = stack.pop()
        children = item.items() if isinstance(item, dict) else enumerate(item) if isinstance(item, list) else ()
        for key, child in children:
            if isinstance(child, (dict, list)):
                if len(path) + 1 >= limit:
                    return (*path, key)
                stack.append(((*path, key), child))
    return None


def register_run(session: Session, key: str, registration: RunRegistration, settings: ServiceSettings) -> RunSummary:
    config = registration.config.model_dump(exclude_unset=True)
    if wire.IMPORTED_FROM in config:
        config[wire.IMPORTED_FROM] = _imported_source(session, key, config[wire.IMPORTED_FROM])
    run = run_queries.register_run(
        session, key, registration.name, registration.world_size, config, config_check(settings)
    )
    now = run_queries.database_now(session)
    return _summary(run, 0, rank_queries.rank_ends(session, [run.id])[run.id], now, settings.silent_after_s)


def _imported_source(session: Session, key: str, source: Any) -> Any:
    """A trace import's ``imported_from`` joined to what the run holds (ranks imported one at a time); ``Conflict``
    for a run that was collected, or a rank already imported from another file (its digest differs)."""
    existing = run_queries.find_run(session, key, for_update=True)  # ranks uploaded at once: one merge at a time
    if existing is None:
        return source
    earlier = (existing.config or {}).get(wire.IMPORTED_FROM)
    if earlier is None:
        raise Conflict("run_key", f"run {key!r} was collected, not imported: import the traces under another run name")
    old, new = earlier.get("digests"), source.get("digests") if isinstance(source, dict) else None
    if isinstance(old, dict) and isinstance(new, dict):
        clashing = sorted(rank for rank, digest in new.items() if rank in old and old[rank] != digest)
        if clashing:
            raise Conflict(
                "run_key",
                f"rank {', '.join(clashing)} of run {key!r} was imported from another file: import into a new run",
            )
    return merged_source(earlier, source) if isinstance(source, dict) else source


def register_rank(session: Session, key: str, rank: int, registration: RankRegistration) -> RankOut:
    run = require_run(session, key)
    if rank >= run.world_size:
        raise Invalid("rank", f"rank {rank} is not below the run's world_size {run.world_size}")
    values = registration.model_dump(exclude_none=True)
    # A rank that registers is alive: a restarted worker (torchrun --max-restarts keeps the run
    # key) clears the end its previous process reported.
    values.update(outcome=None, error=None, ended_at=None, end_ns=None, in_flight=None)
    rank_queries.register_rank(session, run.id, rank, values)
    rank_queries.fill_step_offsets(session, run.id, rank, registration.clock_offset_ns)
    rank_queries.record_contact(session, run.id, rank, None, False)
    run_queries.touch_run(session, run.id)
    info = rank_queries.find_rank(session, run.id, rank)
    assert info is not None
    return _rank_out(info)


def end_rank(session: Session, key: str, rank: int, end: RankEndIn) -> RankOut:
    run = require_run(session, key)
    info = rank_queries.find_rank(session, run.id, rank)
    if info is None:
        raise NotFound("rank", f"rank {rank} of run {key!r} is not registered")
    if end.pid is not None and end.pid != info.pid:  # a restarted worker registered since: stale news
        return _rank_out(info)
    offset = end.clock_offset_ns if end.clock_offset_ns is not None else info.clock_offset_ns
    on_rank0_clock = None if end.end_ns is None else end.end_ns - offset
    rank_queries.end_rank(
        session, run.id, rank, {"outcome": end.outcome, "error": end.error, "end_ns": on_rank0_clock, "in_flight": None}
    )
    rank_queries.record_contact(session, run.id, rank, None, False)
    run_queries.touch_run(session, run.id)
    session.refresh(info)
    return _rank_out(info)


SCAN_CHUNK = 500


def list_runs(
    session: Session,
    limit: int,
    offset: int,
    silent_after_s: float,
    states: Collection[str] | None = None,
    after: int | None = None,
    name: str | None = None,
    since: datetime | None = None,
    run_scope: Sequence[str] | None = None,
) -> tuple[list[RunSummary], int | None]:
    """Runs most recently active first, and the cursor of the next page (None: no more).

    With ``states``, only runs in one of them: the state is worked out per run, so the list is
    scanned in chunks until ``offset + limit`` of them are found. ``after`` is a cursor: the id of
    the last run of the page before (``run_queries.list_runs``). ``run_scope``: only the runs a token bound to
    runs may see (``auth.run_scope``)."""
    now = run_queries.database_now(session)
    found: list[RunSummary] = []
    ids: list[int] = []
    last = after
    chunk = SCAN_CHUNK if states else offset + limit + 1
    only = run_queries.may_be_in(states, now - timedelta(seconds=silent_after_s)) if states else None
    if run_scope is not None:
        in_scope = run_queries.keys_in_scope(run_scope)
        only = in_scope if only is None else and_(only, in_scope)
    while len(found) < offset + limit + 1:
        listed = run_queries.list_runs(session, chunk, after=last, name=name, since=since, only=only)
        ends = rank_queries.rank_ends(session, [run.id for run, _ in listed])
        for run, count in listed:
            summary = _summary(run, count, ends[run.id], now, silent_after_s)
            if not states or summary.state in states:
                found.append(summary)
                ids.append(run.id)
        if len(listed) < chunk:
            break
        last = listed[-1][0].id
    page = found[offset : offset + limit]
    more = len(found) > offset + limit
    return page, (ids[offset + limit - 1] if more and page else None)


def run_detail(session: Session, key: str, silent_after_s: float, ranks_limit: int | None = None) -> RunDetail:
    """The run, its per-step summary and its ranks (``ranks_limit``: that many, those needing attention first)."""
    run = require_run(session, key)
    ends = rank_queries.rank_ends(session, [run.id])[run.id]
    now = run_queries.database_now(session)
    listed = _listed_ranks(ends, ranks_limit, as_utc(now) - timedelta(seconds=silent_after_s))
    totals = step_queries.step_totals(session, run.id)
    first = totals[0].step if totals else None
    seen = step_queries.steps_seen(totals, step_queries.steps_with_spans(session, run.id))
    reporting = analysis.reporting_ranks(run.world_size, run.config)
    warmup_steps = analysis.warmup_steps_of(run.config)
    steps = [
        StepSummary(
            step=row.step,
            ranks_reported=row.ranks,
            wall_ns=step.wall_ns,
            mean_compute_ns=int(row.compute) // row.ranks,
            mean_comm_ns=int(row.comm) // row.ranks,
            mean_idle_ns=int(row.idle) // row.ranks,
            has_spans=step.has_spans,
            complete=analysis.is_complete(step, reporting),
            warmup=analysis.is_warmup(row.step, first, warmup_steps),
        )
        for row, step in zip(totals, seen)
    ]
    summary = _summary(run, len(steps), ends, now, silent_after_s)
    return RunDetail(
        **summary.model_dump(),
        ranks=[_rank_out(info) for info in rank_queries.ranks_of(session, run.id, listed)],
        rank_count=len(ends),
        dropped_spans=rank_queries.dropped_spans(session, run.id),
        steps=steps,
        warmup_until_step=analysis.warmup_until(first, warmup_steps),
        baseline_steps=analysis.BASELINE_STEPS,
        default_step=analysis.default_step(seen, reporting, summary.state in OPEN_STATES, warmup_steps),
    )


def step_detail(
    session: Session, key: str, step: int, ranks: str | None = None, breakdown_limit: int | None = None
) -> StepDetail:
    """Spans of one step on an aligned time axis (of the ranks ``timeline_ranks`` picks, or ``ranks``:
    "0-7,341"), each rank's breakdown (``breakdown_limit``: that many, slowest compute first), and the
    step's bubble."""
    run = require_run(session, key)
    asked = None if ranks is None else parse_ranks(ranks, run.world_size)
    found = read_step(session, run, step)
    if found is None:
        raise NotFound("step", f"run {key!r} has no data for step {step}")
    aligned, breakdowns = found.aligned, found.broken.breakdowns
    origin = min(lo for lo, _ in aligned.record.windows.values())
    shown = timeline_ranks(breakdowns, asked)
    wanted = {r.rank for r in shown}
    return StepDetail(
        run_key=key,
        step=step,
        origin_ns=origin,
        timeline_ranks=[TimelineRankOut.model_validate(r) for r in shown],
        spans=[
            SpanOut(
                rank=row.rank,
                kind=row.kind,
                start_ns=span.start_ns - origin,
                end_ns=span.end_ns - origin,
                stage=row.stage,
                microbatch=row.microbatch,
                peer=row.peer,
                bytes=row.bytes,
                group=row.group,
                name=row.name,
            )
            for row, span in spans_of_ranks(session, run, aligned, wanted)
        ],
        breakdown=[RankBreakdownOut.model_validate(b) for b in _listed(breakdowns, breakdown_limit)],
        breakdown_ranks=len(breakdowns),
        span_sample_ranks=None if aligned.record.sampled is None else len(aligned.record.sampled),
        bubble=StepBubbleOut.model_validate(analysis.bubble_of_step(run.config or {}, found.broken)),
    )


def _listed_ranks(ends: Sequence[RankEnd], limit: int | None, silent_before: datetime) -> list[int] | None:
    """None (every rank), or ``limit`` ranks: failed, blocked in an op, ended, silent since ``silent_before``,
    then the rest, each by rank."""
    if limit is None or len(ends) <= limit:
        return None

    def attention(end: RankEnd) -> int:
        if end.outcome is not None:
            return 0 if end.outcome == "failed" else 2
        if end.in_flight is not None:
            return 1
        return 3 if end.last_heard_at is None or end.last_heard_at < silent_before else 4

    return [end.rank for end in sorted(ends, key=lambda end: (attention(end), end.rank))[:limit]]


def _listed(breakdowns: list[analysis.RankBreakdown], limit: int | None) -> list[analysis.RankBreakdown]:
    """Every breakdown in rank order, or the ``limit`` of slowest compute (the breakdown table's order)."""
    if limit is None:
        return breakdowns
    return sorted(breakdowns, key=lambda b: (-b.compute_ns, b.rank))[:limit]


def _summary(run: Run, step_count: int, ends: Sequence[RankEnd], now: datetime, silent_after_s: float) -> RunSummary:
    state = run_state(run.world_size, ends, run.updated_at, now, silent_after_s, run.config)
    return RunSummary(
        key=run.key,
        name=run.name,
        world_size=run.world_size,
        config=run.config or {},
        created_at=as_utc(run.created_at),
        updated_at=as_utc(run.updated_at),
        step_count=step_count,
        state=state.state,
        state_detail=state.detail,
    )


def _rank_out(info: RankInfo) -> RankOut:
    return RankOut(
        rank=info.rank,
        host=info.host,
        pid=info.pid,
        stage=info.stage,
        stages=info.stages,
        coords=info.coords,
        clock_offset_ns=info.clock_offset_ns,
        clock_uncertainty_ns=info.clock_uncertainty_ns,
        dropped_spans=info.dropped_spans,
        outcome=rank_outcome(info.outcome),
        error=info.error,
        ended_at=None if info.ended_at is None else as_utc(info.ended_at),
        last_heard_at=None if info.last_heard_at is None else as_utc(info.last_heard_at),
        last_step=info.last_step,
        in_flight=info.in_flight,
        memory_limit_bytes=info.memory_limit_bytes,
        stage_layers=info.stage_layers,
        stage_params=info.stage_params,
    )
