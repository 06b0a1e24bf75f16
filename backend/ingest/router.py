"""POST /api/v1/ingest: one batch of spans and step aggregates from one rank."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from bubblescope import wire
from bubblescope.backend.body import BodyLimit, json_body_doc, parse_document, read_json
from bubblescope.backend.caller import require_run_in_scope
from bubblescope.backend.db.engine import transaction
from bubblescope.backend.db.session import database_answered
from bubblescope.backend.errors import error_type
from bubblescope.backend.ingest.gate import IngestGate
from bubblescope.backend.ingest.schemas import IngestBatchIn, IngestResult
from bubblescope.backend.ingest.service import ingest
from bubblescope.backend.ingest.validation import batch_size_check
from bubblescope.backend.service_metrics import INGEST_BATCHES, INGEST_DURATION, INGEST_REJECTED, INGEST_SPANS
from bubblescope.backend.settings import settings_of

router = APIRouter(prefix=wire.API_PREFIX, tags=["ingest"])


@router.post(
    "/ingest",
    response_model=IngestResult,
    status_code=202,
    openapi_extra=json_body_doc(IngestBatchIn),
    summary="Store a batch (gzip allowed); a retried (run_key, rank, seq) is stored once",
    description="503 with Retry-After when the service is behind (docs/limits.md): keep the batch and retry.",
    # The database is used without the DbSession dependency (one thread hop), so say what it would say.
    responses={404: {"description": "No such run: register it first (PUT /api/v1/runs/{run_key})"}},
)
async def ingest_batch(request: Request) -> IngestResult:
    settings = settings_of(request)
    gate: IngestGate = request.app.state.ingest_gate
    with INGEST_DURATION.time():
        try:
            gate.refuse_if_full()
            document = await read_json(request, BodyLimit.for_ingest(settings))  # before a slot: slow bodies hold none
            async with gate.admit():
                result = await run_in_threadpool(_parse_and_store, request, document)
        except Exception as error:
            INGEST_REJECTED.labels(error_type(error)).inc()
            raise
    if not result.duplicate:
        INGEST_BATCHES.inc()
        INGEST_SPANS.inc(result.stored_spans)
        request.app.state.background.news()  # the alert rules see it without waiting their interval
    return result


def _parse_and_store(request: Request, document: Any) -> IngestResult:
    """Parse, store and commit in one worker-thread hop: the path every batch of every rank takes, so
    not through ``DbSession``, whose opening and closing are a hop each (each hop costs the event loop
    a round trip; docs/scale.md). Committed before the answer, as ``DbSession`` does."""
    settings = settings_of(request)
    batch = parse_document(IngestBatchIn, document, batch_size_check(settings))
    require_run_in_scope(request, batch.run_key, ("body", "run_key"))
    with transaction(request.app.state.session_factory) as session:
        result = ingest(session, batch, settings.ingest_batches_per_s, request.app.state.run_toucher)
    database_answered(request)
    return result
