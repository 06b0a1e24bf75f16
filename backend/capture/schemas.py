"""API shapes of capture requests (the answer is ``store.captures.CaptureOut``, which ingest answers too)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict


class CaptureRequestIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: Annotated[int, Strict(), Field(ge=1, le=10_000, description="how many consecutive steps to capture")]


MAX_PROFILE_STEPS = 20
"""A profile's steps: torch.profiler's trace grows with them (a few MiB a step on a large model)."""


class ProfileRequestIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: Annotated[
        int, Strict(), Field(ge=1, le=MAX_PROFILE_STEPS, description="how many consecutive steps to profile")
    ]
