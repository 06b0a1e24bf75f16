"""POST /api/v1/plan: memory, step time, MFU and bubble of one configuration, or the best ranked."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from bubblescope.backend.analysis.planner.request import plan_document
from bubblescope.backend.analysis.planner.specs import PlanInputError
from bubblescope.backend.body import json_body_doc, parse_document, read_json
from bubblescope.backend.errors import ApiError
from bubblescope.backend.plan.schemas import PlanOut, PlanRequestIn

router = APIRouter(prefix="/api/v1", tags=["planner"])


def _plan(document: dict[str, Any]) -> dict[str, Any]:
    try:
        return plan_document(document).as_dict()
    except PlanInputError as error:
        raise ApiError(422, ["body", *error.field.split(".")], error.message) from None


@router.post("/plan", response_model=PlanOut, openapi_extra=json_body_doc(PlanRequestIn),
             summary="Predict memory per GPU, step time, MFU and bubble; or search and rank configurations",
             description="With `config`, that configuration is evaluated (fields left out take defaults: "
                         "tp=pp=vpp=mbs=1, dp = the rest, 1F1B, ZeRO 0, no recompute, sequence parallelism "
                         "when tp > 1). Without it, the fastest configurations that fit are returned, best "
                         "first, holding any `fixed` fields. Same semantics as `bubblescope plan`.")
async def post_plan(request: Request) -> dict[str, Any]:
    body = parse_document(PlanRequestIn, await read_json(request))
    return await run_in_threadpool(_plan, body.model_dump(exclude_none=True))
