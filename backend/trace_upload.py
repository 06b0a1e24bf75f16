"""POST /api/v1/runs/{run_key}/traces: one rank's torch.profiler (Kineto) trace, JSON plain or gzip, stored as
that rank of an imported run: ``bubblescope import-trace`` without the command line (``trace_import``).

At the top of the service's layers because it composes two features: the runs feature registers the run and the
rank, the ingest feature stores each step. The body is streamed to a temporary file (at most
``--max-trace-bytes``), converted, then stored in one transaction, so a refused file stores nothing. Ranks may be
uploaded one request each: the run's ``imported_from`` gathers their files.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import anyio
from fastapi import APIRouter, Query, Request
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from bubblescope import wire
from bubblescope.backend.body import received_chunks
from bubblescope.backend.db.engine import transaction
from bubblescope.backend.errors import ApiError, Invalid, TooLarge
from bubblescope.backend.fields import RunKey
from bubblescope.backend.ingest.schemas import IngestBatchIn
from bubblescope.backend.ingest.service import ingest
from bubblescope.backend.runs.schemas import RankEndIn, RankRegistration, RunRegistration
from bubblescope.backend.runs.service import end_rank, register_rank, register_run
from bubblescope.backend.settings import settings_of
from bubblescope.backend.store.runs import find_run
from bubblescope.kineto import TraceError
from bubblescope.trace_import import convert, merged_source, requests_for

router = APIRouter(prefix=f"{wire.API_PREFIX}/runs", tags=["runs"])


class TraceImported(BaseModel):
    run_key: str
    rank: int
    steps: list[int]
    spans: int


TRACE_BODY = {
    "requestBody": {
        "required": True,
        "description": "One rank's torch.profiler (Kineto) trace as written by export_chrome_trace, plain or gzip "
        "(told by its first bytes). The rank comes from its distributedInfo; docs/traces.md.",
        "content": {"application/json": {"schema": {"type": "string", "format": "binary"}}},
    }
}


@router.post(
    "/{run_key}/traces",
    response_model=TraceImported,
    status_code=201,
    openapi_extra=TRACE_BODY,
    summary="Import one rank's torch.profiler trace into the run (created if new; docs/traces.md)",
)
async def upload_trace(
    run_key: RunKey,
    request: Request,
    name: Annotated[
        str | None, Query(min_length=1, max_length=128, description="the run's name (default: its key)")
    ] = None,
    file: Annotated[
        str,
        Query(
            min_length=1,
            max_length=255,
            pattern=r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$",  # a name, never . or ..: it names a file in a temporary folder
            description="the file's name, shown on the run page; a rank in it (rank3.json.gz) is the rank when the "
            "trace has no distributedInfo",
        ),
    ] = "trace.json",
) -> TraceImported:
    settings = settings_of(request)
    with tempfile.TemporaryDirectory(prefix="bubblescope-trace-") as folder:
        path = Path(folder) / file
        try:
            with anyio.fail_after(settings.body_timeout_s):
                await _receive(request, path, settings.max_trace_bytes)
        except TimeoutError:
            raise ApiError(
                408, ["body"], f"the trace did not arrive within {settings.body_timeout_s:g} s", "timeout"
            ) from None
        return await run_in_threadpool(_store, request, run_key, name or run_key, path)


async def _receive(request: Request, path: Path, limit: int) -> None:
    size = 0
    with path.open("wb") as out:
        async for chunk in received_chunks(request):
            size += len(chunk)
            if size > limit:
                raise TooLarge("body", f"the trace is over {limit} bytes (the service's --max-trace-bytes)")
            out.write(chunk)
    if size == 0:
        raise Invalid("body", "no trace: send one rank's torch.profiler trace file as the body")


def _store(request: Request, run_key: str, name: str, path: Path) -> TraceImported:
    settings = settings_of(request)
    try:
        imported = convert(path, run_key)
    except TraceError as error:
        raise Invalid("body", str(error).replace(f"{path}: ", "", 1)) from None
    with transaction(request.app.state.session_factory) as session:
        existing = find_run(session, run_key)
        earlier = (existing.config or {}).get(wire.IMPORTED_FROM) if existing is not None else None
        for method, where, document in requests_for([imported], run_key, name):
            if method == "PUT" and where.endswith(f"/runs/{run_key}"):
                source = merged_source(earlier, document["config"][wire.IMPORTED_FROM])
                world = max(document["world_size"], existing.world_size if existing is not None else 0)
                registration = {**document, "world_size": world, "config": {wire.IMPORTED_FROM: source}}
                register_run(session, run_key, RunRegistration.model_validate(registration), settings)
            elif method == "PUT" and where.endswith("/end"):
                end_rank(session, run_key, imported.rank, RankEndIn.model_validate(document))
            elif method == "PUT":
                register_rank(session, run_key, imported.rank, RankRegistration.model_validate(document))
            else:
                batch = IngestBatchIn.model_validate(document)
                ingest(session, batch, settings.ingest_batches_per_s, request.app.state.run_toucher)
    request.app.state.background.news()
    spans = sum(len(batch["spans"]["step"]) for batch in imported.batches)
    return TraceImported(run_key=run_key, rank=imported.rank, steps=imported.steps, spans=spans)
