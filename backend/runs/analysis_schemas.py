"""API shapes of a run's analysis and what-if replays."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict

from bubblescope.backend.analysis.attribution import BubbleAttribution, StageImbalance
from bubblescope.backend.analysis.pipeline_profile import MeasuredPipeline
from bubblescope.backend.analysis.suggestions import Suggestion

Count = Annotated[int, Strict(), Field(ge=1, le=100_000)]


class StageBreakdownOut(BaseModel):
    """Means over the stage's ranks and the analysed steps, ns."""

    stage: int | None
    ranks: list[int]
    window_ns: float
    compute_ns: float
    exposed_comm_ns: float
    overlapped_comm_ns: float
    dependency_wait_ns: float
    transfer_ns: float
    idle_ns: float
    bubble_fraction: float


class AnalysisOut(BaseModel):
    run_key: str
    steps: list[int] = Field(description="the steps analysed (with spans; step 0 left out when others exist)")
    step_ns: float = Field(description="median step wall time over those steps")
    stages: list[StageBreakdownOut]
    exposed_comm_ns_by_group: dict[str, float] = Field(description="mean per rank per step, pipeline p2p excluded")
    pipeline: MeasuredPipeline | None = Field(description="the run in the simulator's terms")
    pipeline_unavailable: str | None = Field(description="why there is no pipeline replay, when there is none")
    attribution: BubbleAttribution | None
    imbalance: StageImbalance | None
    suggestions: list[Suggestion] = Field(description="ranked by predicted gain")


class WhatIfIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schedule: str | None = Field(default=None, description="gpipe, 1f1b, interleaved1f1b, loopedbfs, interleavedzb, zbv, dualpipev, naive")
    microbatches: Count | None = None
    microbatch_scale: Annotated[float, Field(gt=0, le=1000)] = Field(
        default=1.0, description="scale of every action's duration: b'/b for another micro-batch size")
    stages_per_rank: Annotated[int, Strict(), Field(ge=1, le=64)] | None = None
    layers_per_stage: Annotated[list[Count], Field(min_length=1, max_length=4096)] | None = None
    slowest_rank_to_median: bool = False
    overlap_communication: bool = False
    from_step: Annotated[int, Strict(), Field(ge=0)] | None = None
    to_step: Annotated[int, Strict(), Field(ge=0)] | None = None


class PredictionOut(BaseModel):
    measured_step_ns: float
    schedule: str
    microbatches: int
    stages_per_rank: int
    layers_per_stage: list[int] | None
    step_ns: float
    bubble_fraction: float
    peak_activations: int
    idle_ns_per_rank: list[float]
