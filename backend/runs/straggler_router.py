"""GET /api/v1/runs/{run_key}/stragglers: which ranks, hosts, stages or replicas are slow."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from bubblescope.backend.db.session import DbSession
from bubblescope.backend.runs.router import RunKey
from bubblescope.backend.runs.straggler_schemas import StragglersOut
from bubblescope.backend.runs.stragglers import DEFAULT_STEPS, MAX_STEPS, straggler_view

router = APIRouter(prefix="/api/v1/runs", tags=["runs"])


@router.get(
    "/{run_key}/stragglers", response_model=StragglersOut,
    summary="Stragglers: rank × step matrices, robust per-rank scores, slow hosts / stages / replicas",
    description=f"Scores the steps in [from_step, to_step] (inclusive). Without from_step the range is the "
                f"{DEFAULT_STEPS} steps up to to_step (default: the newest step); at most {MAX_STEPS} steps. "
                "The algorithm is written out in backend/analysis/stragglers.py.",
)
def get_stragglers(
    run_key: RunKey,
    session: DbSession,
    from_step: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    to_step: Annotated[int | None, Query(ge=0, le=2**62)] = None,
) -> StragglersOut:
    return straggler_view(session, run_key, from_step, to_step)
