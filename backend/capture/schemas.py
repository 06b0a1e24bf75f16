"""API shapes of capture requests (the answer is ``store.captures.CaptureOut``, which ingest answers too)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict


class CaptureRequestIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: Annotated[int, Strict(), Field(ge=1, le=10_000, description="how many consecutive steps to capture")]
