"""POST /api/v1/runs/{key}/flight-recorder: one rank's Flight Recorder dump; GET: the run's dumps read together."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool

from bubblescope import wire
from bubblescope.backend.body import received_chunks, require_file_type
from bubblescope.backend.db.session import DbSession
from bubblescope.backend.errors import Invalid, TooLarge
from bubblescope.backend.fields import RunKey
from bubblescope.backend.flight_recorder import service
from bubblescope.backend.flight_recorder.schemas import DumpOut, FlightRecorderOut
from bubblescope.backend.settings import settings_of
from bubblescope.fr_dump import MAX_DUMP_BYTES

router = APIRouter(prefix=f"{wire.API_PREFIX}/runs", tags=["flight recorder"])

DUMP_BODY = {
    "requestBody": {
        "required": True,
        "description": "One rank's Flight Recorder dump as torch writes it: the pickle (_dump_fr_trace, "
        "TORCH_FR_DUMP_TEMP_FILE + rank) or its JSON. A pickle is read with an unpickler that builds plain "
        "values only; docs/traces.md.",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


@router.post(
    "/{run_key}/flight-recorder",
    response_model=DumpOut,
    status_code=201,
    openapi_extra=DUMP_BODY,
    summary="Upload one rank's PyTorch Flight Recorder dump (replaces that rank's earlier one)",
)
async def upload_dump(
    run_key: RunKey,
    request: Request,
    session: DbSession,
    file: Annotated[
        str,
        Query(
            min_length=1,
            max_length=255,
            description="the dump's file name; its rank (nccl_trace_rank_3) is the rank unless rank is given",
        ),
    ] = "dump",
    rank: Annotated[int | None, Query(ge=0, le=1_000_000, description="the dump's rank")] = None,
) -> DumpOut:
    require_file_type(request)
    limit = min(MAX_DUMP_BYTES, settings_of(request).max_trace_bytes)
    async with request.app.state.trace_gate.admit():  # file uploads share one gate (app.py): few bodies at once
        chunks: list[bytes] = []
        size = 0
        async for chunk in received_chunks(request):
            size += len(chunk)
            if size > limit:
                raise TooLarge("body", f"the dump is over {limit} bytes")
            chunks.append(chunk)
        if size == 0:
            raise Invalid("body", "no dump: send one rank's Flight Recorder dump as the body")
        return await run_in_threadpool(service.store_dump, session, run_key, b"".join(chunks), file, rank)


@router.get(
    "/{run_key}/flight-recorder",
    response_model=FlightRecorderOut,
    summary="The run's Flight Recorder dumps read together: per process group each rank's progress, the first "
    "collective not every rank joined, mismatches",
)
def get_report(run_key: RunKey, session: DbSession) -> FlightRecorderOut:
    return service.report(session, run_key)
