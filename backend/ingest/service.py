"""Store an ingest batch: all of it, once, or nothing."""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from bubblescope import wire
from bubblescope.backend.db.engine import after_commit
from bubblescope.backend.db.models import Run
from bubblescope.backend.errors import NotFound
from bubblescope.backend.ingest import queries
from bubblescope.backend.ingest.schemas import IngestBatchIn, IngestResult
from bubblescope.backend.ingest.validation import check_batch
from bubblescope.backend.store.captures import CaptureOut, pending_captures
from bubblescope.backend.store.ranks import record_contact
from bubblescope.backend.store.touch import RunToucher

_RUNS = Run.__table__.c
_RUN_FOR_INGEST = select(_RUNS.id, _RUNS.key, _RUNS.world_size).where(_RUNS.key == bindparam("key"))


def ingest(session: Session, batch: IngestBatchIn, batches_per_s: float, toucher: RunToucher) -> IngestResult:
    """Validate against the run, claim (run, rank, seq), then write steps and spans; the answer tells
    the collector its flush interval for the run's size (``wire.flush_interval_for``).

    Runs inside the request's transaction: any error rolls every row of the batch back.
    """
    run = session.connection().execute(_RUN_FOR_INGEST, {"key": batch.run_key}).one_or_none()
    if run is None:
        raise NotFound(
            "run_key",
            f"unknown run {batch.run_key!r}: register it first with PUT {wire.API_PREFIX}/runs/{batch.run_key}",
        )
    check_batch(batch, run.world_size)
    span_count = len(batch.spans.step)
    captures = _captures_for(session, run.id, batch)
    interval = wire.flush_interval_for(run.world_size, batches_per_s)
    if not queries.claim_batch(session, run.id, batch.rank, batch.seq, span_count, len(batch.steps)):
        return IngestResult(
            stored_spans=0, stored_steps=0, duplicate=True, captures=captures, flush_interval_s=interval
        )
    rank_offset = record_contact(session, run.id, batch.rank, _last_step(batch), _in_flight(batch))
    stored_steps = queries.upsert_steps(session, run.id, batch.rank, batch.steps, rank_offset)
    stored_spans = queries.insert_spans(session, run.id, batch.rank, batch.spans)
    if batch.dropped_spans:
        queries.record_dropped(session, run.id, batch.rank, batch.dropped_spans)
    run_id, run_key = run.id, run.key
    # The revision bump (store.touch): after the commit, not inside, where batches would queue on the row.
    after_commit(session, lambda own: toucher.committed(own, run_id, run_key))
    return IngestResult(
        stored_spans=stored_spans,
        stored_steps=stored_steps,
        duplicate=False,
        captures=captures,
        flush_interval_s=interval,
    )


def _captures_for(session: Session, run_id: int, batch: IngestBatchIn) -> list[CaptureOut]:
    """Pending capture requests the sending rank has not shipped past (none for a step-less batch)."""
    if not batch.steps:
        return []
    return pending_captures(session, run_id, max(step.step for step in batch.steps))


def _last_step(batch: IngestBatchIn) -> int | None:
    return max((step.step for step in batch.steps), default=None)


def _in_flight(batch: IngestBatchIn) -> dict[str, Any] | Literal[False] | None:
    """What to store as the rank's op in flight: the report, None (moving again: clear), or
    False (a step-less batch without a report, e.g. counters: leave it)."""
    if batch.in_flight is not None:
        return batch.in_flight.model_dump()
    return None if batch.steps else False
