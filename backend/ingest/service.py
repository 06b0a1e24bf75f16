"""Store an ingest batch: all of it, once, or nothing."""

from __future__ import annotations

from sqlalchemy.orm import Session

from bubblescope.backend.errors import ApiError
from bubblescope.backend.ingest import repository
from bubblescope.backend.ingest.schemas import IngestBatchIn, IngestResult
from bubblescope.backend.ingest.validation import check_batch
from bubblescope.backend.runs.repository import find_run, touch_run


def ingest(session: Session, batch: IngestBatchIn) -> IngestResult:
    """Validate against the run, claim (run, rank, seq), then write steps and spans.

    Runs inside the request's transaction: any error rolls every row of the batch back.
    """
    run = find_run(session, batch.run_key)
    if run is None:
        raise ApiError(
            404,
            ["body", "run_key"],
            f"unknown run {batch.run_key!r}: register it first with PUT /api/v1/runs/{batch.run_key}",
        )
    check_batch(batch, run.world_size)
    span_count = len(batch.spans.step)
    if not repository.claim_batch(session, run.id, batch.rank, batch.seq, span_count):
        return IngestResult(stored_spans=0, stored_steps=0, duplicate=True)
    stored_steps = repository.upsert_steps(session, run.id, batch.rank, batch.steps)
    stored_spans = repository.insert_spans(session, run.id, batch.rank, batch.spans)
    if batch.dropped_spans:
        repository.record_dropped(session, run.id, batch.rank, batch.dropped_spans)
    touch_run(session, run.id)
    return IngestResult(stored_spans=stored_spans, stored_steps=stored_steps, duplicate=False)
