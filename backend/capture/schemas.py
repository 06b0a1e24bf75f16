"""API shapes of capture requests (the answer is ``store.captures.CaptureOut``, which ingest answers too)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict


class CaptureRequestIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: Annotated[int, Strict(), Field(ge=1, le=10_000, description="how many consecutive steps to capture")]


MAX_PROFILE_STEPS = 20
"""A profile's steps: torch.profiler's trace grows with them (a few MiB a step on a large model)."""


MAX_PROFILE_UPLOADS = 8
"""Ranks of one profile that upload their traces: each is a few MiB to a few hundred, and the service imports one at a
time; every rank still profiles (and keeps its trace on its own disk)."""


class ProfileRequestIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: Annotated[
        int, Strict(), Field(ge=1, le=MAX_PROFILE_STEPS, description="how many consecutive steps to profile")
    ]
    upload_ranks: Annotated[
        list[Annotated[int, Strict(), Field(ge=0, le=1_000_000)]] | None,
        Field(
            min_length=1,
            max_length=MAX_PROFILE_UPLOADS,
            description=f"the ranks that upload their traces to the service (at most {MAX_PROFILE_UPLOADS}); "
            f"default: ranks 0 to {MAX_PROFILE_UPLOADS - 1}. Every rank profiles and keeps its trace on its disk",
        ),
    ] = None
