"""POST /api/v1/runs/{key}/capture: full spans of the same K upcoming steps on every rank."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from bubblescope import wire
from bubblescope.backend.body import json_body_doc, parse_document, read_json
from bubblescope.backend.capture import service
from bubblescope.backend.capture.schemas import CaptureOut, CaptureRequestIn
from bubblescope.backend.db.session import DbSession
from bubblescope.backend.fields import RunKey

router = APIRouter(prefix=f"{wire.API_PREFIX}/runs", tags=["capture"])


@router.post(
    "/{run_key}/capture",
    response_model=CaptureOut,
    status_code=201,
    openapi_extra=json_body_doc(CaptureRequestIn),
    summary="Capture the full spans of the next K steps on every rank (the same steps)",
    description="Ranks learn of it from their next ingest answers. `from_step` is the highest step ingested + 1 + "
    "three times the most steps a rank recently sent per batch, so that no rank has started it yet "
    "when it learns (see backend/capture/service.py).",
)
async def post_capture(run_key: RunKey, request: Request, session: DbSession) -> CaptureOut:
    body = parse_document(CaptureRequestIn, await read_json(request))
    return await run_in_threadpool(service.request_capture, session, run_key, body)
