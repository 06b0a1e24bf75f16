"""Checks across fields that a schema cannot express; each error names the field and index."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bubblescope import wire
from bubblescope.backend.errors import Invalid, TooLarge
from bubblescope.backend.ingest.schemas import IngestBatchIn, SpanColumns
from bubblescope.backend.settings import ServiceSettings


def batch_size_check(settings: ServiceSettings) -> Callable[[Any], None]:
    """A check of the raw document's list lengths, run before validation builds any of it."""

    def check(document: Any) -> None:
        if not isinstance(document, dict):
            return  # validation names the problem
        spans = document.get("spans")
        for column, values in spans.items() if isinstance(spans, dict) else ():
            if isinstance(values, list) and len(values) > settings.max_batch_spans:
                raise TooLarge(
                    ("spans", column), f"{len(values)} spans exceed the limit of {settings.max_batch_spans} per batch"
                )
        steps = document.get("steps")
        if isinstance(steps, list) and len(steps) > settings.max_batch_steps:
            raise TooLarge("steps", f"{len(steps)} steps exceed the limit of {settings.max_batch_steps} per batch")

    return check


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
