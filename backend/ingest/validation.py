"""Checks across fields that a schema cannot express; each error names the field and index."""

from __future__ import annotations

from bubblescope import wire
from bubblescope.backend.errors import Invalid, TooLarge
from bubblescope.backend.ingest.schemas import IngestBatchIn, SpanColumns

MAX_SPANS_PER_BATCH = 1_000_000


def check_batch(batch: IngestBatchIn, world_size: int) -> None:
    if batch.rank >= world_size:
        raise Invalid("rank", f"rank {batch.rank} is not below the run's world_size {world_size}")
    _check_spans(batch.spans)
    seen: set[int] = set()
    for index, step in enumerate(batch.steps):
        if step.step in seen:
            raise Invalid(("steps", index, "step"), f"step {step.step} appears more than once in the batch")
        seen.add(step.step)
        if step.end_ns < step.start_ns:
            raise Invalid(("steps", index, "end_ns"), f"end_ns ({step.end_ns}) is before start_ns ({step.start_ns})")


def _check_spans(spans: SpanColumns) -> None:
    count = len(spans.step)
    if count > MAX_SPANS_PER_BATCH:
        raise TooLarge("spans", f"{count} spans exceed the limit of {MAX_SPANS_PER_BATCH} per batch")
    for column in wire.SPAN_FIELDS[1:]:  # every column but step, whose length is the count
        values = getattr(spans, column)
        if values is not None and len(values) != count:
            raise Invalid(
                ("spans", column),
                f"has {len(values)} entries but spans.step has {count}; every column needs one per span",
            )
    for index, (start, end) in enumerate(zip(spans.start_ns, spans.end_ns)):
        if end < start:
            raise Invalid(
                ("spans", "end_ns", index), f"end_ns ({end}) is before start_ns ({start}): times are reversed"
            )
