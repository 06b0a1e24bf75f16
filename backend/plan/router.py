"""POST /api/v1/plan: memory, step time, MFU and bubble of one configuration, or the best ranked."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from bubblescope import wire
from bubblescope.backend.body import json_body_doc, parse_document, read_json
from bubblescope.backend.plan import service
from bubblescope.backend.plan.schemas import PlanOut, PlanRequestIn

router = APIRouter(prefix=wire.API_PREFIX, tags=["planner"])


@router.post(
    "/plan",
    response_model=PlanOut,
    openapi_extra=json_body_doc(PlanRequestIn),
    summary="Predict memory per GPU, step time, MFU and bubble; or search and rank configurations",
    description="With `config`, that configuration is evaluated (fields left out take defaults: "
    "tp=pp=mbs=1, dp = the rest, 1F1B, vpp = the schedule's stages per rank, ZeRO 0, no "
    "recompute, sequence parallelism when tp > 1). Without it, the fastest configurations "
    "that fit are returned, best first, holding any `fixed` fields. Same semantics as "
    "`bubblescope plan`; see docs/planner.md.",
)
async def post_plan(request: Request) -> PlanOut:
    body = parse_document(PlanRequestIn, await read_json(request, unique_keys=True))
    return await run_in_threadpool(service.plan, body)
