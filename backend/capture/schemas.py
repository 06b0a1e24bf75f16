"""API shapes of capture requests."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict


class CaptureRequestIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: Annotated[int, Strict(), Field(ge=1, le=10_000, description="how many consecutive steps to capture")]


class CaptureOut(BaseModel):
    """A capture request: every rank ships full spans of steps [from_step, from_step + steps)."""

    id: int
    steps: int
    from_step: int
