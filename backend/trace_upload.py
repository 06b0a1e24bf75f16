"""POST /api/v1/runs/{run_key}/traces: one rank's torch.profiler (Kineto) trace, JSON plain or gzip, stored as
that rank of an imported run: ``bubblescope import-trace`` without the command line (``trace_import``).

At the top of the service's layers because it composes two features: the runs feature registers the run and the
rank, the ingest feature stores each step. The body is streamed to a temporary file (at most
``--max-trace-bytes``, written off the event loop), converted, then stored in one transaction, so a refused file
stores nothing. One upload is worked on at a time and ``TRACE_QUEUE`` more wait (a conversion takes a core for
seconds to minutes); past that the sender is told to retry (503 with ``Retry-After``). Ranks may be
uploaded one request each: the run's ``imported_from`` gathers their files.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Final

import anyio
from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ValidationError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from bubblescope import wire
from bubblescope.backend.body import received_chunks, require_file_type
from bubblescope.backend.db.engine import transaction
from bubblescope.backend.errors import ApiError, Invalid, TooLarge
from bubblescope.backend.fields import RunKey
from bubblescope.backend.ingest.gate import IngestGate
from bubblescope.backend.ingest.schemas import IngestBatchIn
from bubblescope.backend.ingest.service import ingest
from bubblescope.backend.runs.schemas import RankEndIn, RankRegistration, RunRegistration
from bubblescope.backend.runs.service import end_rank, register_rank, register_run
from bubblescope.backend.settings import settings_of
from bubblescope.backend.store.runs import find_run
from bubblescope.kineto import TraceError
from bubblescope.trace_import import ImportedRank, convert, requests_for

router = APIRouter(prefix=f"{wire.API_PREFIX}/runs", tags=["runs"])


class TraceImported(BaseModel):
    run_key: str
    rank: int
    steps: list[int]
    spans: int


def file_name(description: str) -> Any:
    """The query parameter naming an uploaded file: a name, never ``.`` or ``..`` (it names a file in a temporary
    folder)."""
    return Query(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$", description=description)


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
        file_name(
            "the file's name, shown on the run page; a rank in it (rank3.json.gz) is the rank when the trace has no "
            "distributedInfo"
        ),
    ] = "trace.json",
) -> TraceImported:
    async with received_trace(request, file) as path:
        return await run_in_threadpool(_store, request, run_key, name, path)


@asynccontextmanager
async def received_trace(request: Request, file: str) -> AsyncIterator[Path]:
    """The request's body in a temporary file named ``file``, admitted by the file-upload gate (one worked on at a
    time, ``TRACE_QUEUE`` waiting, 503 past that), within ``--max-trace-bytes`` and ``--trace-timeout``; the file
    and its folder are removed on leaving."""
    require_file_type(request)
    settings = settings_of(request)
    gate: IngestGate = request.app.state.trace_gate
    async with gate.admit(), _temporary_folder() as folder:
        path = Path(folder) / file
        try:
            with anyio.fail_after(settings.trace_timeout_s):
                await _receive(request, path, settings.max_trace_bytes)
        except TimeoutError:
            raise ApiError(
                408,
                ["body"],
                f"the trace did not arrive within {settings.trace_timeout_s:g} s (--trace-timeout)",
                "timeout",
            ) from None
        yield path


@asynccontextmanager
async def _temporary_folder() -> AsyncIterator[str]:
    folder = await anyio.to_thread.run_sync(lambda: tempfile.mkdtemp(prefix="bubblescope-trace-"))
    try:
        yield folder
    finally:
        await anyio.to_thread.run_sync(lambda: shutil.rmtree(folder, ignore_errors=True))


TRACE_QUEUE: Final = 4  # trace uploads waiting for the one in work, past which a sender retries
WRITE_BYTES: Final = 4 << 20  # the body goes to disk in pieces this large, off the event loop


async def _receive(request: Request, path: Path, limit: int) -> None:
    size = 0
    pending: list[bytes] = []
    with await anyio.to_thread.run_sync(path.open, "wb") as out:
        async for chunk in received_chunks(request):
            size += len(chunk)
            if size > limit:
                raise TooLarge("body", f"the trace is over {limit} bytes (the service's --max-trace-bytes)")
            pending.append(chunk)
            if sum(map(len, pending)) >= WRITE_BYTES:
                await anyio.to_thread.run_sync(out.write, b"".join(pending))
                pending.clear()
        await anyio.to_thread.run_sync(out.write, b"".join(pending))
    if size == 0:
        raise Invalid("body", "no trace: send one rank's torch.profiler trace file as the body")


def _store(request: Request, run_key: str, name: str | None, path: Path) -> TraceImported:
    imported = converted(path, run_key)
    with transaction(request.app.state.session_factory) as session:  # a refusal part-way rolls back every write
        existing = find_run(session, run_key)
        shown = name or (existing.name if existing is not None else run_key)  # a later rank keeps the run's name
        spans = store_imported(session, request, imported, run_key, shown)
    request.app.state.background.news()
    return TraceImported(run_key=run_key, rank=imported.rank, steps=imported.steps, spans=spans)


def converted(path: Path, run_key: str) -> ImportedRank:
    """The received file as one rank of run ``run_key``; a 422 naming the body for a file that is not a trace."""
    try:
        return convert(path, run_key)
    except TraceError as error:
        raise Invalid("body", str(error).replace(f"{path}: ", "", 1)) from None


def store_imported(session: Session, request: Request, imported: ImportedRank, run_key: str, name: str) -> int:
    """Store a converted rank as the collector would send it (the run, the rank, its steps, its end) in the
    caller's transaction; the spans stored."""
    settings = settings_of(request)
    spans = 0
    for method, where, document in requests_for([imported], run_key, name):  # one batch in memory at a time
        try:
            body = RUN_BODIES[_route(method, where, run_key)].model_validate(document)
        except ValidationError as error:
            raise Invalid("body", f"the trace cannot be stored: {error.errors()[0]['msg']}") from None
        if isinstance(body, RunRegistration):
            register_run(session, run_key, body, settings)
        elif isinstance(body, RankRegistration):
            register_rank(session, run_key, imported.rank, body)
        elif isinstance(body, RankEndIn):
            end_rank(session, run_key, imported.rank, body)
        elif isinstance(body, IngestBatchIn):
            ingest(session, body, settings.ingest_batches_per_s, request.app.state.run_toucher)
            spans += len(body.spans.step)
    return spans


RUN_BODIES: dict[str, type[BaseModel]] = {
    "run": RunRegistration,
    "rank": RankRegistration,
    "end": RankEndIn,
    "batch": IngestBatchIn,
}


def _route(method: str, where: str, run_key: str) -> str:
    """Which of the collector's calls ``requests_for`` made: the run's registration, the rank's, its end, a batch."""
    if method == "POST":
        return "batch"
    if where.endswith("/end"):
        return "end"
    return "run" if where.endswith(f"/runs/{run_key}") else "rank"
