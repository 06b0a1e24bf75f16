"""A stored run's report (``analysis.analyse_run``) and what-if replays (``analysis.what_if``): the steps
the analysis names read from the store, each broken down once per revision (``derived.steps``), the ranks'
memory peaks over them, and the straggler report over their span (``derived.stragglers``)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from bubblescope import analysis
from bubblescope.backend.db.models import Run
from bubblescope.backend.derived.steps import read_step, run_rank_places
from bubblescope.backend.derived.stragglers import straggler_report
from bubblescope.backend.errors import DomainError, Invalid, NotFound
from bubblescope.backend.fields import check_step_order
from bubblescope.backend.store import ranks as rank_queries, steps as step_queries


@dataclass(frozen=True)
class StoredWindow:
    """A window of a stored run's steps, read and broken down."""

    facts: analysis.RunFacts
    window: analysis.StepWindow
    steps: list[analysis.BrokenDownStep]


def run_report(session: Session, run: Run, from_step: int | None, to_step: int | None) -> analysis.RunReport:
    """The report over the newest ``analysis.MAX_ANALYSED_STEPS`` steps with spans in the range;
    ``NotFound`` (``from_step``) when none has spans."""
    read = read_window(session, run, from_step, to_step)
    memory = step_queries.memory_peaks(session, run.id, read.window.steps)
    return analysis.analyse_run(read.facts, read.window, read.steps, memory, _stragglers(session, run, read.window))


def run_what_if(
    session: Session, run: Run, change: analysis.Change, from_step: int | None, to_step: int | None
) -> analysis.WhatIf:
    """``change`` replayed over the window's measured pipeline; ``Invalid`` (``run_key``) when the run holds none."""
    read = read_window(session, run, from_step, to_step)
    try:
        return analysis.what_if(read.facts, read.steps, change)
    except analysis.NotReplayable as error:
        raise Invalid("run_key", f"run {run.key!r} cannot be replayed: {error.message}") from None


def read_window(session: Session, run: Run, from_step: int | None, to_step: int | None) -> StoredWindow:
    check_step_order(from_step, to_step)
    seen = step_queries.run_steps_seen(session, run.id)
    config = run.config or {}
    reporting, warmup_steps = analysis.reporting_ranks(run.world_size, config), analysis.warmup_steps_of(config)
    window = analysis.choose_steps(seen, reporting, from_step, to_step, warmup_steps)
    if not window.steps:
        raise NotFound("from_step", f"run {run.key!r} has no step with spans in the range")
    facts = analysis.RunFacts(
        world_size=run.world_size,
        config=run.config or {},
        places=run_rank_places(session, run),
        stage_sizes=rank_queries.stage_sizes(session, run.id),
    )
    steps = []
    for step in window.steps:
        found = read_step(session, run, step)
        assert found is not None  # a step with spans or aggregates
        steps.append(found.broken)
    return StoredWindow(facts, window, steps)


def _stragglers(session: Session, run: Run, window: analysis.StepWindow) -> analysis.StragglerReport | None:
    """The straggler report the suggestions read (``analysis.straggler_range``), or None."""
    span = analysis.straggler_range(window)
    if span is None:
        return None
    try:
        return straggler_report(session, run.key, *span)[1]
    except DomainError:
        return None  # a range the straggler view refuses (too long): no straggler evidence
