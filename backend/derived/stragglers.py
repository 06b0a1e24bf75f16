"""A run's straggler report over a step range, once per (run, revision, range): the stragglers view,
the report's straggler notes and the alert rules all ask for it; and the rule of the default range."""

from __future__ import annotations

from sqlalchemy.orm import Session

from bubblescope import analysis
from bubblescope.backend.derived.steps import run_rank_places
from bubblescope.backend.errors import Invalid
from bubblescope.backend.fields import check_step_order
from bubblescope.backend.store import steps as step_queries
from bubblescope.backend.store.memo import ENTRIES, SingleFlightMemo, run_memo_key
from bubblescope.backend.store.runs import require_run

# Without from_step the range ends at to_step (default: the newest) and holds DEFAULT_STEPS steps, or
# fewer for a big run: at most DEFAULT_CELLS rank × step cells, at least MIN_DEFAULT_STEPS steps (the
# alert rules' straggler verdict needs 10). Scoring costs ~15 µs a cell: 1,024 ranks keep 100 steps
# (1.5 s), 16,384 ranks get 10 (2.5 s) where 100 steps took ~25 s and a 15-MB page answer.
DEFAULT_STEPS = 100
DEFAULT_CELLS = 163_840
MIN_DEFAULT_STEPS = 10
# A range asked for holds at most MAX_STEPS steps and MAX_CELLS cells (16,384 ranks: 122 steps).
MAX_STEPS = 1000
MAX_CELLS = 2_000_000


def default_steps(ranks: int) -> int:
    """How many steps a default range of a run of ``ranks`` ranks holds."""
    return max(MIN_DEFAULT_STEPS, min(DEFAULT_STEPS, DEFAULT_CELLS // max(1, ranks)))


def max_steps(ranks: int) -> int:
    """How many steps a range asked for may hold."""
    return max(1, min(MAX_STEPS, MAX_CELLS // max(1, ranks)))


def step_range(
    newest: int | None,
    from_step: int | None,
    to_step: int | None,
    ranks: int = 1,
    first: int | None = None,
    warmup_steps: int = analysis.WARMUP_STEPS,
) -> tuple[int, int] | None:
    """The inclusive range to score for a run of ``ranks`` ranks, or None when the run has no steps and
    none was asked for. Without ``from_step`` the range starts past the warm-up of a run whose first step
    is ``first`` (when any of its steps up to the end is past it): a warm-up step is slow on every rank."""
    check_step_order(from_step, to_step)
    most = max_steps(ranks)
    if from_step is not None and to_step is not None:
        if to_step - from_step + 1 > most:
            raise Invalid(
                "to_step",
                f"the range holds more than {most} steps (at most {MAX_STEPS}, and {MAX_CELLS:,} ranks × steps)",
            )
        return from_step, to_step
    if from_step is not None:  # up to the newest step, at most ``most``
        return from_step, max(from_step, min(from_step if newest is None else newest, from_step + most - 1))
    end = to_step if to_step is not None else newest
    if end is None:
        return None
    start = max(0, end - default_steps(ranks) + 1)
    warm = analysis.warmup_until(first, warmup_steps)
    return (max(start, warm) if warm is not None and warm <= end else start), end


_REPORTS: SingleFlightMemo[analysis.StragglerReport] = SingleFlightMemo(ENTRIES)


def straggler_report(
    session: Session, key: str, from_step: int | None, to_step: int | None
) -> tuple[tuple[int, int] | None, analysis.StragglerReport]:
    """The range scored and its report, once per (run, revision, range): the run page's stragglers,
    the analysis' straggler notes and the alert rules all ask for it."""
    run = require_run(session, key)
    newest, first = step_queries.newest_step(session, run.id), step_queries.first_step(session, run.id)
    chosen = step_range(newest, from_step, to_step, run.world_size, first, analysis.warmup_steps_of(run.config))

    def compute() -> analysis.StragglerReport:
        times = step_queries.aggregates_between(session, run.id, *chosen) if chosen else []
        return analysis.straggler_report(times, run_rank_places(session, run))

    return chosen, _REPORTS.get(run_memo_key(session, run, "stragglers", chosen), compute)
