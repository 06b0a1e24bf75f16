"""What the API's shapes share: strict integers (a JSON ``"8"`` or ``true`` is refused, not coerced),
the run key and rank in paths, step bounds in queries and their order, and the base of the response
models that are filled from the analysis dataclasses."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query
from pydantic import BaseModel, ConfigDict, Field, Strict

from bubblescope.backend.errors import Invalid

# What the database columns hold (docs/limits.md): every integer the API takes is bounded to fit.
INT32_MAX = 2**31 - 1  # Integer columns: ranks, stages, micro-batches, peers, counts per batch
INT64_MAX = 2**63 - 1  # BigInteger columns
COUNT_MAX = 2**62  # steps, sequence numbers, byte counts, epoch and duration nanoseconds
OFFSET_NS_MAX = 2**61  # a clock offset (73 years): a time minus an offset still fits in 64 bits
STEP_MAX = 2**53 - 1  # a step number: the largest integer a browser's numbers hold exactly (JSON in JavaScript)

PositiveInt = Annotated[int, Strict(), Field(ge=1, le=INT32_MAX)]
NonNegativeInt = Annotated[int, Strict(), Field(ge=0, le=INT32_MAX)]
Count = Annotated[int, Strict(), Field(ge=0, le=COUNT_MAX)]
Nanos = Count
ClockOffsetNs = Annotated[int, Strict(), Field(ge=-OFFSET_NS_MAX, le=OFFSET_NS_MAX)]
ClockUncertaintyNs = Annotated[int, Strict(), Field(ge=0, le=OFFSET_NS_MAX)]
Step = Annotated[int, Strict(), Field(ge=0, le=STEP_MAX)]

RUN_KEY_PATTERN = r"^[A-Za-z0-9._:-]*[A-Za-z0-9_:-][A-Za-z0-9._:-]*$"
"""A run key: letters, digits and . _ : -, with one that is not a dot (``.`` and ``..`` are path segments a
browser or proxy resolves: such a run could never be opened)."""
RunKey = Annotated[str, Path(min_length=1, max_length=128, pattern=RUN_KEY_PATTERN)]
RankIndex = Annotated[int, Path(ge=0, le=INT32_MAX)]
StepIndex = Annotated[int, Path(ge=0, le=STEP_MAX)]
StepBound = Annotated[int | None, Query(ge=0, le=STEP_MAX, description="first/last step of the range (inclusive)")]


def check_step_order(from_step: int | None, to_step: int | None) -> None:
    """A range given both ways round is refused, naming ``from_step``."""
    if from_step is not None and to_step is not None and from_step > to_step:
        raise Invalid("from_step", f"from_step {from_step} is after to_step {to_step}")


class FromAnalysis(BaseModel):
    """A response model of the API's own, filled from an analysis result's attributes."""

    model_config = ConfigDict(from_attributes=True)
