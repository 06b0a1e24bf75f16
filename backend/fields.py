"""Field types the API's request shapes share: strict integers (a JSON ``"8"`` or ``true`` is
refused, not coerced)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, Strict

PositiveInt = Annotated[int, Strict(), Field(ge=1)]
NonNegativeInt = Annotated[int, Strict(), Field(ge=0)]
