"""API shape of the stragglers view: the analysis dataclasses, with the step range they cover."""

from __future__ import annotations

from pydantic import BaseModel, Field

from bubblescope.backend.analysis.stragglers import (
    Finding,
    GroupFinding,
    PhaseMatrix,
    RankScore,
    StragglerThresholds,
)


class StragglersOut(BaseModel):
    run_key: str
    from_step: int | None = Field(description="first step of the range (None: the run has no steps yet)")
    to_step: int | None
    ranks: list[int] = Field(description="row order of every matrix")
    steps: list[int] = Field(description="column order of every matrix (steps some rank reported)")
    matrices: dict[str, PhaseMatrix] = Field(description="window, compute, comm, exposed_comm, idle")
    flagged: list[list[bool]] = Field(description="compute cells flagged against the rank's basis")
    rank_scores: list[RankScore]
    groups: list[GroupFinding]
    findings: list[Finding] = Field(description="what to read first, in plain English")
    thresholds: StragglerThresholds
