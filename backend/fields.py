"""What the API's shapes share: strict integers (a JSON ``"8"`` or ``true`` is refused, not coerced),
the run key and rank in paths, step bounds in queries and their order, and the base of the response
models that are filled from the analysis dataclasses."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query
from pydantic import BaseModel, ConfigDict, Field, Strict

from bubblescope.backend.errors import Invalid

PositiveInt = Annotated[int, Strict(), Field(ge=1)]
NonNegativeInt = Annotated[int, Strict(), Field(ge=0)]

RunKey = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")]
RankIndex = Annotated[int, Path(ge=0, le=2**31 - 1)]
StepBound = Annotated[int | None, Query(ge=0, le=2**62, description="first/last step of the range (inclusive)")]


def check_step_order(from_step: int | None, to_step: int | None) -> None:
    """A range given both ways round is refused, naming ``from_step``."""
    if from_step is not None and to_step is not None and from_step > to_step:
        raise Invalid("from_step", f"from_step {from_step} is after to_step {to_step}")


class FromAnalysis(BaseModel):
    """A response model of the API's own, filled from an analysis result's attributes."""

    model_config = ConfigDict(from_attributes=True)
