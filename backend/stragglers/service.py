"""The stragglers view of a run: its per-step aggregates over a step range, scored by
``analysis.stragglers``."""

from __future__ import annotations

from dataclasses import fields

from sqlalchemy.orm import Session

from bubblescope.analysis.stragglers import PHASES, RankPlacement, StragglerReport, find_stragglers
from bubblescope.analysis.warmup import warmup_until
from bubblescope.backend.errors import Invalid
from bubblescope.backend.fields import check_step_order
from bubblescope.backend.runs import queries as run_queries
from bubblescope.backend.runs.service import require_run
from bubblescope.backend.runs.step_memo import ENTRIES, SingleFlightMemo, run_memo_key
from bubblescope.backend.runs.step_spans import run_rank_places
from bubblescope.backend.stragglers import queries
from bubblescope.backend.stragglers.schemas import StragglersOut

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
    newest: int | None, from_step: int | None, to_step: int | None, ranks: int = 1, first: int | None = None
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
    warm = warmup_until(first)
    return (max(start, warm) if warm is not None and warm <= end else start), end


def chosen_phases(asked: list[str] | None) -> tuple[str, ...]:
    """The phases whose matrices an answer carries (all by default); an unknown one is a 422."""
    if not asked:
        return PHASES
    unknown = sorted(set(asked) - set(PHASES))
    if unknown:
        raise Invalid("phases", f"unknown phase {unknown[0][:40]!r}; the phases are {', '.join(PHASES)}")
    return tuple(p for p in PHASES if p in asked)


_REPORTS: SingleFlightMemo[StragglerReport] = SingleFlightMemo(ENTRIES)


def straggler_report(
    session: Session, key: str, from_step: int | None, to_step: int | None
) -> tuple[tuple[int, int] | None, StragglerReport]:
    """The range scored and its report, once per (run, revision, range): the run page's stragglers,
    the analysis' straggler notes and the alert rules all ask for it."""
    run = require_run(session, key)
    newest, first = run_queries.newest_step(session, run.id), run_queries.first_step(session, run.id)
    chosen = step_range(newest, from_step, to_step, run.world_size, first)

    def compute() -> StragglerReport:
        rows = queries.aggregates_between(session, run.id, *chosen) if chosen else []
        places = run_rank_places(session, run)
        return find_stragglers(rows, [RankPlacement(p.rank, p.host, p.stage, p.coords) for p in places])

    return chosen, _REPORTS.get(run_memo_key(session, run, "stragglers", chosen), compute)


def straggler_view(
    session: Session,
    key: str,
    from_step: int | None,
    to_step: int | None,
    phases: tuple[str, ...] = PHASES,
    compact: bool = False,
) -> StragglersOut:
    """The report as the API answers it; ``compact``: without what a heat-map does not draw (each cell's
    time and ratio to the step median, the full flag matrix, the scores of ranks scored normal), a
    fifth of the bytes at 1,024 ranks."""
    chosen, report = straggler_report(session, key, from_step, to_step)
    matrices = {phase: matrix for phase, matrix in report.matrices.items() if phase in phases}
    return StragglersOut.model_validate(
        {
            "run_key": key,
            "from_step": chosen[0] if chosen else None,
            "to_step": chosen[1] if chosen else None,
            **{f.name: getattr(report, f.name) for f in fields(report)},
            "matrices": (
                {p: {**vars(m), "values_ns": None, "ratio_to_step_median": None} for p, m in matrices.items()}
                if compact
                else matrices
            ),
            "flagged": None if compact else report.flagged,
            "flagged_cells": [(i, j) for i, row in enumerate(report.flagged) for j, hit in enumerate(row) if hit],
            "hosts": [s.host for s in report.rank_scores],
            "stages": [s.stage for s in report.rank_scores],
            "rank_scores": [s for s in report.rank_scores if s.verdict != "normal"] if compact else report.rank_scores,
        }
    )
