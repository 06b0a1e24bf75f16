"""POST /api/v1/ingest: one batch of spans and step aggregates from one rank."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from bubblescope import wire
from bubblescope.backend.body import json_body_doc, parse_document, read_json
from bubblescope.backend.db.session import DbSession
from bubblescope.backend.ingest.schemas import IngestBatchIn, IngestResult
from bubblescope.backend.ingest.service import ingest

router = APIRouter(prefix=wire.API_PREFIX, tags=["ingest"])


@router.post(
    "/ingest",
    response_model=IngestResult,
    status_code=202,
    openapi_extra=json_body_doc(IngestBatchIn),
    summary="Store a batch (gzip allowed); a retried (run_key, rank, seq) is stored once",
)
async def ingest_batch(request: Request, session: DbSession) -> IngestResult:
    document = await read_json(request)
    batch = await run_in_threadpool(parse_document, IngestBatchIn, document)
    return await run_in_threadpool(ingest, session, batch)
