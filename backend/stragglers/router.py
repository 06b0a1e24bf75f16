"""GET /api/v1/runs/{run_key}/stragglers: which ranks, hosts, stages or replicas are slow."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from bubblescope import wire
from bubblescope.analysis import PHASES
from bubblescope.backend.db.session import DbSession
from bubblescope.backend.derived.answers import cached_answer
from bubblescope.backend.derived.stragglers import DEFAULT_CELLS, DEFAULT_STEPS, MAX_CELLS, MAX_STEPS, MIN_DEFAULT_STEPS
from bubblescope.backend.fields import RunKey, StepBound
from bubblescope.backend.stragglers.schemas import StragglersOut
from bubblescope.backend.stragglers.service import chosen_phases, straggler_view

router = APIRouter(prefix=f"{wire.API_PREFIX}/runs", tags=["stragglers"])


@router.get(
    "/{run_key}/stragglers",
    response_model=StragglersOut,
    summary="Stragglers: rank × step matrices, robust per-rank scores, slow hosts / stages / replicas",
    description=f"Scores the steps in [from_step, to_step] (inclusive). Without from_step the range is the "
    f"{DEFAULT_STEPS} steps up to to_step (default: the newest step), fewer for a big run: at most "
    f"{DEFAULT_CELLS:,} ranks × steps, at least {MIN_DEFAULT_STEPS} steps. A range asked for holds at most "
    f"{MAX_STEPS} steps and {MAX_CELLS:,} ranks × steps. "
    "The algorithm is written out in analysis/stragglers.py.",
)
def get_stragglers(
    run_key: RunKey,
    session: DbSession,
    request: Request,
    from_step: StepBound = None,
    to_step: StepBound = None,
    phases: Annotated[
        list[str] | None,
        Query(
            max_length=len(PHASES),
            description=f"the matrices to include, of {', '.join(PHASES)} (default: all); the run page asks for "
            "compute only: a 1,024-rank × 100-step answer with all five is ~18 MB",
        ),
    ] = None,
    compact: Annotated[
        bool,
        Query(
            description="the run page's shape: no values_ns (ratio × step_median_ns), no flagged matrix "
            "(flagged_cells lists them), rank_scores only for ranks not scored normal"
        ),
    ] = False,
) -> Response:
    chosen = chosen_phases(phases)
    return cached_answer(
        request, session, run_key, lambda: straggler_view(session, run_key, from_step, to_step, chosen, compact)
    )
