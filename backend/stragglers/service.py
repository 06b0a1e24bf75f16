"""The stragglers view of a run: its straggler report (``derived.stragglers``) as the API answers it."""

from __future__ import annotations

from dataclasses import fields

from sqlalchemy.orm import Session

from bubblescope import analysis
from bubblescope.backend.derived.stragglers import straggler_report
from bubblescope.backend.errors import Invalid
from bubblescope.backend.stragglers.schemas import StragglersOut


def chosen_phases(asked: list[str] | None) -> tuple[str, ...]:
    """The phases whose matrices an answer carries (all by default); an unknown one is a 422."""
    if not asked:
        return analysis.PHASES
    unknown = sorted(set(asked) - set(analysis.PHASES))
    if unknown:
        raise Invalid("phases", f"unknown phase {unknown[0][:40]!r}; the phases are {', '.join(analysis.PHASES)}")
    return tuple(p for p in analysis.PHASES if p in asked)


def straggler_view(
    session: Session,
    key: str,
    from_step: int | None,
    to_step: int | None,
    phases: tuple[str, ...] | None = None,
    compact: bool = False,
) -> StragglersOut:
    """The report as the API answers it; ``compact``: without what a heat-map does not draw (each cell's
    time and ratio to the step median, the full flag matrix, the scores of ranks scored normal), a
    fifth of the bytes at 1,024 ranks."""
    chosen, report = straggler_report(session, key, from_step, to_step)
    shown = analysis.PHASES if phases is None else phases
    matrices = {phase: matrix for phase, matrix in report.matrices.items() if phase in shown}
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
