"""A run's analysis (why the bubble, what to change) and what-if replays of the measured run."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from bubblescope import analysis, wire
from bubblescope.backend.analysis import service
from bubblescope.backend.analysis.schemas import AnalysisOut, PredictionOut, WhatIfIn
from bubblescope.backend.body import json_body_doc, parse_document, read_json
from bubblescope.backend.db.session import DbSession
from bubblescope.backend.derived.answers import cached_answer
from bubblescope.backend.fields import RunKey, StepBound

router = APIRouter(prefix=f"{wire.API_PREFIX}/runs", tags=["analysis"])


@router.get(
    "/{run_key}/analysis",
    response_model=AnalysisOut,
    summary="Why the bubble is what it is, and what to change: attribution, imbalance, ranked suggestions",
    description=f"Reads the newest {analysis.MAX_ANALYSED_STEPS} steps with spans in [from_step, to_step] (default: "
    "every step with spans; step 0, the warm-up, left out). See docs/analysis.md.",
)
def get_analysis(
    run_key: RunKey, session: DbSession, request: Request, from_step: StepBound = None, to_step: StepBound = None
) -> Response:
    return cached_answer(request, session, run_key, lambda: service.run_analysis(session, run_key, from_step, to_step))


@router.post(
    "/{run_key}/whatif",
    response_model=PredictionOut,
    openapi_extra=json_body_doc(WhatIfIn),
    summary="Replay the measured run with one thing changed: micro-batches, schedule, layer split, ...",
)
async def post_whatif(run_key: RunKey, request: Request, session: DbSession) -> PredictionOut:
    body = parse_document(WhatIfIn, await read_json(request))
    return await run_in_threadpool(service.what_if, session, run_key, body)
