"""The ingest batch as the service validates it (the wire format is in ``bubblescope.wire``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict

from bubblescope import wire
from bubblescope.backend.fields import ClockOffsetNs, ClockUncertaintyNs, Count, Nanos, NonNegativeInt as Index, Step
from bubblescope.backend.store.captures import CaptureOut

if TYPE_CHECKING:
    SpanKind = str
else:  # an enum of wire's kinds in the OpenAPI document; refused with the valid ones named
    SpanKind = Literal[tuple(sorted(wire.SPAN_KINDS))]
Label = Annotated[str, Field(max_length=64)]
FAIL_FAST = Field(fail_fast=True)
"""On a list: its first bad entry is the one error (100,000 bad entries are not 100,000 errors)."""


class SpanColumns(BaseModel):
    """Spans column-wise: every list has one entry per span. Optional columns may be omitted."""

    model_config = ConfigDict(extra="forbid")

    step: Annotated[list[Step], FAIL_FAST]
    kind: Annotated[list[SpanKind], FAIL_FAST]
    start_ns: Annotated[list[Nanos], FAIL_FAST]
    end_ns: Annotated[list[Nanos], FAIL_FAST]
    stage: Annotated[list[Index | None], FAIL_FAST] | None = None
    microbatch: Annotated[list[Index | None], FAIL_FAST] | None = None
    peer: Annotated[list[Index | None], FAIL_FAST] | None = None
    bytes: Annotated[list[Count | None], FAIL_FAST] | None = None
    group: Annotated[list[Annotated[str, Field(max_length=32)] | None], FAIL_FAST] | None = None
    name: Annotated[list[Label | None], FAIL_FAST] | None = None


class StepAggregateIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step: Step
    start_ns: Nanos
    end_ns: Nanos
    compute_ns: Nanos
    comm_ns: Nanos
    exposed_comm_ns: Nanos
    idle_ns: Nanos
    span_count: Index
    clock_offset_ns: ClockOffsetNs | None = Field(
        default=None, description="this rank's clock minus rank 0's in force for the step"
    )
    clock_uncertainty_ns: ClockUncertaintyNs | None = None
    peak_rss_bytes: Count | None = Field(default=None, description="the process's peak resident set in the step")
    gpu_peak_allocated_bytes: Count | None = Field(default=None, description="CUDA allocator's peak allocated bytes")
    gpu_peak_reserved_bytes: Count | None = Field(default=None, description="CUDA allocator's peak reserved bytes")
    gpu_alloc_retries: Count | None = Field(default=None, description="CUDA allocator's retries in the step")


Seconds = Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)]


class BlockedOpIn(BaseModel):
    """The communication op a rank is blocked in (``wire``'s ``in_flight.op``)."""

    model_config = ConfigDict(extra="forbid")

    kind: Annotated[str, Field(min_length=1, max_length=32)]
    name: Label | None = None
    group: Annotated[str, Field(max_length=32)] | None = None
    peer: Index | None = None
    bytes: Count | None = None
    elapsed_s: Seconds


class InFlightIn(BaseModel):
    """The collector watchdog's report of a step running far past its usual length."""

    model_config = ConfigDict(extra="forbid")

    step: Step
    in_step: Annotated[bool, Strict()] = Field(description="false: between steps, after step - 1")
    elapsed_s: Seconds
    op: BlockedOpIn | None = Field(default=None, description="null: not in a communication op")


class IngestBatchIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_key: Annotated[str, Field(min_length=1, max_length=128)]
    rank: Index
    seq: Count
    dropped_spans: Index = 0
    steps: Annotated[list[StepAggregateIn], FAIL_FAST] = Field(default_factory=list)
    spans: SpanColumns
    in_flight: InFlightIn | None = Field(
        default=None, description="the watchdog's report of a long step (sent with no steps while it lasts)"
    )


class IngestResult(BaseModel):
    stored_spans: int
    stored_steps: int
    flush_interval_s: float = Field(
        default=0.0,
        description="the shortest interval at which each rank of this run should flush: world_size / the "
        "service's --ingest-batches-per-s, at most 60 s (a collector configured slower keeps its own)",
    )
    duplicate: bool = Field(description="True when this (run, rank, seq) was already stored")
    captures: list[CaptureOut] = Field(
        default_factory=list,
        description="capture requests this rank has not shipped past yet (by the batch's newest step): "
        "ship full spans of steps [from_step, from_step + steps)",
    )
