"""The Flight Recorder report as the API answers it, filled from ``analysis.FlightRecorderReport``."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from bubblescope.backend.fields import FromAnalysis


class DumpOut(BaseModel):
    rank: int
    file: str
    uploaded_at: datetime


class RankProgressOut(FromAnalysis):
    rank: int
    last_enqueued: int | None = Field(description="its last enqueued collective's sequence id (null: none)")
    last_started: int | None
    last_completed: int | None
    blocked_in: str | None = Field(
        description='"#N op": it joined the first collective not every rank joined and has not completed it'
    )


class WavefrontOut(FromAnalysis):
    seq: int = Field(description="the first collective not every rank of the group joined")
    op: str | None
    joined: list[int]
    missing: list[int]


class MismatchOut(FromAnalysis):
    seq: int
    what: str = Field(description="op, input sizes, output sizes or input dtypes")
    values: dict[int, str] = Field(description="each rank's value")


class GroupOut(FromAnalysis):
    group: str
    description: str
    ranks: list[int]
    without_dump: list[int] = Field(description="ranks of the group whose dump was not uploaded")
    progress: list[RankProgressOut]
    wavefront: WavefrontOut | None
    mismatches: list[MismatchOut]


class FlightRecorderOut(BaseModel):
    run_key: str
    dumps: list[DumpOut]
    groups: list[GroupOut] = Field(description="per process group; the ones where a rank went further come first")
