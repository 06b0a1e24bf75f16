"""POST /api/v1/runs/{key}/capture: full spans of the same K upcoming steps on every rank; POST .../profile:
torch.profiler over them."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from bubblescope import wire
from bubblescope.backend.body import json_body_doc, parse_document, read_json
from bubblescope.backend.capture import service
from bubblescope.backend.capture.schemas import CaptureRequestIn, ProfileRequestIn
from bubblescope.backend.db.session import DbSession
from bubblescope.backend.fields import RunKey
from bubblescope.backend.settings import settings_of
from bubblescope.backend.store.captures import CaptureOut

router = APIRouter(prefix=f"{wire.API_PREFIX}/runs", tags=["capture"])


@router.post(
    "/{run_key}/capture",
    response_model=CaptureOut,
    status_code=201,
    openapi_extra=json_body_doc(CaptureRequestIn),
    summary="Capture the full spans of the next K steps on every rank (the same steps)",
    responses={
        200: {"description": "a request that no rank has begun yet was already waiting: that one"},
        429: {"description": "past serve --captures-per-hour requests for this run in the last hour"},
    },
    description="Ranks learn of it from their next ingest answers. At most one request waits per run (a "
    "repeat gets it back with 200), and `serve --captures-per-hour` per run (429 with Retry-After beyond). `from_step` is the highest step ingested + 1 + "
    "three times the most steps a rank recently sent per batch, so that no rank has started it yet "
    "when it learns (see backend/capture/service.py).",
)
async def post_capture(run_key: RunKey, request: Request, response: Response, session: DbSession) -> CaptureOut:
    return await _asked("spans", CaptureRequestIn, run_key, request, response, session)


@router.post(
    "/{run_key}/profile",
    response_model=CaptureOut,
    status_code=201,
    openapi_extra=json_body_doc(ProfileRequestIn),
    summary="Run torch.profiler over the next K steps on every rank (the same steps)",
    responses={
        200: {"description": "a profile request that no rank has begun yet was already waiting: that one"},
        429: {
            "description": "past serve --captures-per-hour requests (captures and profiles) for this run in the last hour"
        },
    },
    description="Each rank learns of it from its next ingest answer, as of a capture (the same `from_step` rule and "
    "limits), profiles steps [from_step, from_step + steps) with torch.profiler (CPU, and CUDA where the job uses "
    "it) and writes one Kineto trace per rank on its own disk, beside its spool: "
    "`<spool_dir>/../profiles/<run key>/rank<R>-steps<A>-<B>.json.gz`, ready for `bubblescope import-trace`. "
    "The training thread never waits for the trace to be written.",
)
async def post_profile(run_key: RunKey, request: Request, response: Response, session: DbSession) -> CaptureOut:
    return await _asked("profile", ProfileRequestIn, run_key, request, response, session)


async def _asked(
    kind: str,
    model: type[CaptureRequestIn] | type[ProfileRequestIn],
    run_key: str,
    request: Request,
    response: Response,
    session: DbSession,
) -> CaptureOut:
    """A capture request of ``kind``: 201 when stored, 200 with the one of its kind already waiting."""
    body = parse_document(model, await read_json(request))
    answer, created = await run_in_threadpool(
        service.request_capture, session, run_key, body, settings_of(request), kind
    )
    if not created:
        response.status_code = 200
    return answer
