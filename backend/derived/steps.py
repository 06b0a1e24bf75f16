"""A step read and broken down, once per (run, revision, step), and the run's rank places, once per
(run, revision): the step view, the report and the stragglers the page asks for at once all start there."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from bubblescope.analysis import BrokenDownStep, RankPlace, break_down_step
from bubblescope.backend.db.models import Run
from bubblescope.backend.store import ranks as rank_queries
from bubblescope.backend.store.memo import ENTRIES, SingleFlightMemo, run_memo_key
from bubblescope.backend.store.step_read import AlignedStep, aligned_step


@dataclass(frozen=True)
class ReadStep:
    """A step as read (its rows, for the step view) and broken down (shared between requests: read,
    never change)."""

    aligned: AlignedStep
    broken: BrokenDownStep


_STEPS: SingleFlightMemo[ReadStep | None] = SingleFlightMemo(ENTRIES)
_RANK_PLACES: SingleFlightMemo[list[RankPlace]] = SingleFlightMemo(ENTRIES)


def run_rank_places(session: Session, run: Run) -> list[RankPlace]:
    """``store.ranks.rank_places``, once per (run, revision) (16,384 ranks: 0.1 s)."""
    return _RANK_PLACES.get(
        run_memo_key(session, run, "rank places"), lambda: rank_queries.rank_places(session, run.id)
    )


def read_step(session: Session, run: Run, step: int) -> ReadStep | None:
    """The step read and broken down (None: no data for it), once per (run, revision, step)."""

    def compute() -> ReadStep | None:
        places = run_rank_places(session, run)
        aligned = aligned_step(session, run, places, step)
        if aligned is None:
            return None
        return ReadStep(aligned, break_down_step(aligned.record, places))

    return _STEPS.get(run_memo_key(session, run, "step", step), compute)
