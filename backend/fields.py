"""Field and parameter types the API's request shapes share: strict integers (a JSON ``"8"`` or
``true`` is refused, not coerced), the run key and rank in paths, step bounds in queries."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query
from pydantic import Field, Strict

PositiveInt = Annotated[int, Strict(), Field(ge=1)]
NonNegativeInt = Annotated[int, Strict(), Field(ge=0)]

RunKey = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")]
RankIndex = Annotated[int, Path(ge=0, le=2**31 - 1)]
StepBound = Annotated[int | None, Query(ge=0, le=2**62, description="first/last step of the range (inclusive)")]
