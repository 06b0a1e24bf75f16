"""API shapes for runs, ranks and steps."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationInfo, field_validator

from bubblescope.analysis import MAX_LAYERS, RULES
from bubblescope.backend.fields import (
    INT64_MAX,
    RUN_KEY_PATTERN,
    ClockOffsetNs,
    ClockUncertaintyNs,
    Count,
    FromAnalysis,
    Nanos,
    NonNegativeInt,
    PositiveInt,
)
from bubblescope.backend.store.state import RankOutcome, RunStateName

StageIndex = NonNegativeInt
LayerCount = Annotated[int, Strict(), Field(ge=1, le=MAX_LAYERS)]
"""At most the analysis's total (``pipeline_profile.MAX_LAYERS``), which it checks across stages."""


if TYPE_CHECKING:
    AlertName = str
else:  # an enum of the rules' names in the OpenAPI document
    AlertName = Literal[tuple(rule.alertname for rule in RULES)]
PositiveSeconds = Annotated[float, Field(gt=0, le=30 * 86400, allow_inf_nan=False)]


class AlertOverrides(BaseModel):
    """A run's own alert thresholds (its config's ``alerts`` key): each replaces the ``serve`` option
    of the same name for this run; ``disabled`` turns rules off."""

    model_config = ConfigDict(extra="forbid")

    hung_after_s: PositiveSeconds | None = None
    regression_percent: Annotated[float, Field(gt=0, le=10_000)] | None = None
    regression_for_s: PositiveSeconds | None = None
    bubble_over_floor_points: Annotated[float, Field(gt=0, le=100)] | None = None
    bubble_for_steps: Annotated[int, Field(ge=1, le=10_000)] | None = None
    disabled: Annotated[list[AlertName], Field(max_length=len(RULES))] | None = None


class RunConfig(BaseModel):
    """A run's configuration: any keys, but those the analysis reads must have their types (a
    ``"num_microbatches": "eight"`` is refused at registration, not failed on later)."""

    model_config = ConfigDict(extra="allow")

    schedule: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    num_stages: PositiveInt | None = None
    num_microbatches: PositiveInt | None = None
    virtual_stages: PositiveInt | None = None
    pipeline_ranks: PositiveInt | None = None
    stage_indices: Annotated[list[StageIndex], Field(max_length=4096)] | None = None
    layers_per_stage: (
        LayerCount
        | Annotated[list[Annotated[int, Strict(), Field(ge=0, le=MAX_LAYERS)]], Field(max_length=4096)]
        | None
    ) = Field(default=None, description=f"layers on each stage (or on every stage); at most {MAX_LAYERS:,} in all")
    microbatch_size: PositiveInt | None = None
    global_batch: PositiveInt | None = None
    tp: PositiveInt | None = None
    pp: PositiveInt | None = None
    dp: PositiveInt | None = None
    zero: Annotated[int, Strict(), Field(ge=0, le=3)] | None = None
    recompute: Annotated[str, Field(max_length=32)] | None = None
    grad_reduce: Literal["fp32", "bf16", "fp16"] | None = Field(
        default=None, description="the type gradients are reduced in (the planner's suggestions; default fp32)"
    )
    compile: Annotated[bool, Strict()] | None = Field(
        default=None, description="element-wise kernels fused (torch.compile or Megatron's); default true"
    )
    fp8_all_gather: Annotated[bool, Strict()] | None = Field(
        default=None, description="FP8 weights gathered in one byte (the planner's suggestions; default false)"
    )
    attention_kernel: Literal["cudnn", "flash2"] | None = Field(
        default=None, description="the fused attention the job runs (the planner's suggestions; default cudnn)"
    )
    kv_repeated: Annotated[bool, Strict()] | None = Field(
        default=None,
        description="keys and values repeated to every query head (the planner's suggestions; default false)",
    )
    overlap_param_gather: Annotated[bool, Strict()] | None = Field(
        default=None,
        description="ZeRO-1/2's weight all-gather under the next forward, Megatron's --overlap-param-gather (the "
        "planner's suggestions; default false)",
    )
    projections: Literal["fused", "separate", "fused_qkv"] | None = Field(
        default=None,
        description="which linear projections run as one GEMM: fused (the default), separate, fused_qkv (the "
        "planner's suggestions)",
    )
    dispatcher: Literal["alltoall", "deepep", "hybridep"] | None = Field(
        default=None, description="how a mixture of experts' routed tokens travel (the planner's suggestions)"
    )
    alerts: AlertOverrides | None = Field(default=None, description="this run's alert thresholds (docs/alerts.md)")
    title: Annotated[str, Field(min_length=1, max_length=200)] | None = Field(
        default=None, description="one line on what this run tried: the run list shows it under the name"
    )
    compare_with: Annotated[str, Field(min_length=1, max_length=128, pattern=RUN_KEY_PATTERN)] | None = Field(
        default=None,
        description="the key of the run this one re-runs with a change: the run list and the run page link to the "
        "two side by side (/compare)",
    )


class RunRegistration(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(min_length=1, max_length=128)]
    world_size: Annotated[int, Strict(), Field(ge=1, le=1_000_000)]
    config: RunConfig = Field(default_factory=RunConfig)


MeshDimension = Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
MeshCoordinate = NonNegativeInt


class RankRegistration(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: Annotated[str, Field(min_length=1, max_length=255)]
    pid: Annotated[int, Strict(), Field(ge=0, le=INT64_MAX)]
    stage: StageIndex | None = None
    stages: Annotated[list[StageIndex], Field(max_length=4096)] | None = Field(
        default=None, description="every pipeline (virtual) stage index this rank runs"
    )
    coords: Annotated[dict[MeshDimension, MeshCoordinate], Field(max_length=16)] | None = Field(
        default=None, description='coordinate in each named mesh dimension, e.g. {"dp": 1, "pp": 0}'
    )
    clock_offset_ns: ClockOffsetNs = 0
    clock_uncertainty_ns: ClockUncertaintyNs = 0
    memory_limit_bytes: Count | None = Field(
        default=None, description="what the rank may use: its GPU's memory, or its share of the host's"
    )
    stage_layers: Annotated[list[LayerCount], Field(max_length=4096)] | None = Field(
        default=None,
        description="layers of each of this rank's stages (same order as stages), as the collector counted them",
    )
    stage_params: Annotated[list[Count], Field(max_length=4096)] | None = Field(
        default=None, description="parameters of each of this rank's stages (same order as stages)"
    )

    @field_validator("stage_layers", "stage_params")
    @classmethod
    def _one_per_stage(cls, value: list[int] | None, info: ValidationInfo) -> list[int] | None:
        stages = info.data.get("stages")
        if value is not None and (stages is None or len(value) != len(stages)):
            raise ValueError(f"needs stages and one count per stage ({len(stages or [])}), got {len(value)}")
        return value


class RankEndIn(BaseModel):
    """How a rank's process ended, sent by the collector on its way out."""

    model_config = ConfigDict(extra="forbid")

    outcome: RankOutcome
    error: Annotated[str, Field(max_length=1000, description="the uncaught exception, for a failed rank")] | None = None
    end_ns: Annotated[
        Nanos | None, Field(description="when it ended: epoch ns on the rank's own clock, like its spans")
    ] = None
    clock_offset_ns: Annotated[
        ClockOffsetNs | None,
        Field(description="this rank's clock minus rank 0's when it ended (default: the offset it registered)"),
    ] = None
    pid: Annotated[
        int | None,
        Strict(),
        Field(
            ge=0,
            le=INT64_MAX,
            description="the process that ended; an end from another process than the one registered now "
            "(a worker restarted since) is ignored",
        ),
    ] = None

    @field_validator("error")
    @classmethod
    def error_only_when_failed(cls, error: str | None, info: ValidationInfo) -> str | None:
        if error is not None and info.data.get("outcome") != "failed":
            raise ValueError("an error is given only with outcome 'failed'")
        return error


class RankOut(BaseModel):
    rank: int
    host: str
    pid: int
    stage: int | None
    stages: list[int] | None
    coords: dict[str, int] | None
    clock_offset_ns: int
    clock_uncertainty_ns: int
    dropped_spans: int
    outcome: RankOutcome | None = Field(description="how the rank ended; null: not (yet) reported")
    error: str | None
    ended_at: datetime | None = Field(description="when the service received the end")
    last_heard_at: datetime | None = Field(default=None, description="when the service last heard from the rank")
    last_step: int | None = Field(default=None, description="its newest finished step")
    memory_limit_bytes: int | None = Field(default=None, description="what the rank may use, as it registered")
    stage_layers: list[int] | None = Field(default=None, description="layers of each of its stages, as registered")
    stage_params: list[int] | None = Field(default=None, description="parameters of each of its stages, as registered")
    in_flight: dict[str, Any] | None = Field(
        default=None,
        description="the collector watchdog's report while a step runs far past its usual length: step, in_step, "
        "elapsed_s, op (kind, name, group, peer, bytes, elapsed_s; null outside any collective); durations as of "
        "last_heard_at",
    )


class RunSummary(BaseModel):
    key: str
    name: str
    world_size: int
    config: dict[str, Any]
    created_at: datetime
    updated_at: datetime = Field(description="when the service last heard from any rank")
    step_count: int
    state: RunStateName = Field(
        description="running, finished, failed (a rank ended on an error) or silent "
        "(not ended, nothing heard for silent_after_s)"
    )
    state_detail: str


class StepSummary(BaseModel):
    step: int
    ranks_reported: int
    wall_ns: int = Field(description="aligned first start to last end over the ranks")
    mean_compute_ns: int
    mean_comm_ns: int
    mean_idle_ns: int
    has_spans: bool
    complete: bool = Field(
        description="every rank reported the step (not a crashed run's last, nor one still arriving)"
    )
    warmup: bool = Field(description="one of the run's first steps: left out of baselines, defaults and the analysis")


class RunDetail(RunSummary):
    ranks: list[RankOut] = Field(
        description="every registered rank in rank order; with `ranks_limit`, at most that many: failed, blocked "
        "in an op, ended or silent ranks first, then the lowest ranks"
    )
    rank_count: int = Field(description="how many ranks registered (`ranks` may list fewer)")
    dropped_spans: int = Field(description="spans the collectors dropped, summed over every rank")
    steps: list[StepSummary]
    warmup_until_step: int | None = Field(
        description="steps before this one are warm-up (the run's first 5): left out of baselines and default steps"
    )
    baseline_steps: int = Field(description="the run's baseline step time: the median of this many steps after warm-up")
    default_step: int | None = Field(
        description="the step a run page opens on: of the complete steps with spans past the warm-up, the newest "
        "while the run runs, else the one whose wall time is nearest the median (None: no step with spans)"
    )


class SpanOut(BaseModel):
    rank: int
    kind: str
    start_ns: int = Field(description="aligned to rank 0's clock, relative to the step's start")
    end_ns: int
    stage: int | None
    microbatch: int | None
    peer: int | None
    bytes: int | None
    group: str | None
    name: str | None


class RankBreakdownOut(FromAnalysis):
    """Where one rank's step window went, ns: ``window = compute + exposed_comm + idle``;
    ``exposed_comm = dependency_wait + transfer``; ``bubble = idle + dependency_wait`` (docs/time.md)."""

    rank: int
    stage: int | None
    window_ns: int
    compute_ns: int
    comm_ns: int
    overlapped_comm_ns: int
    exposed_comm_ns: int
    dependency_wait_ns: int
    transfer_ns: int
    idle_ns: int
    bubble_ns: int
    bubble_fraction: float
    from_spans: bool = Field(
        description="true: measured from the rank's spans; false: from its step aggregate (a run past 2,048 "
        "ranks reads the spans of a sample of replicas), dependency wait = its stage's sampled median share"
    )


class StepBubbleOut(FromAnalysis):
    """The step's measured bubble (mean over ranks, wall window of all ranks) beside the schedule's closed form."""

    schedule: str | None
    num_stages: int | None
    num_microbatches: int | None
    wall_ns: int
    measured_fraction: float
    theoretical_fraction: float | None
    formula: str | None


class TimelineRankOut(FromAnalysis):
    rank: int
    stage: int | None
    role: str = Field(
        description='why its spans are here: "every rank", "asked", "median of N" or "slowest of N" '
        "(of the N ranks of its stage)"
    )


class StepDetail(BaseModel):
    run_key: str
    step: int
    origin_ns: int = Field(description="aligned epoch ns that span times are relative to")
    timeline_ranks: list[TimelineRankOut] = Field(
        description="the ranks whose spans are in `spans`, in display order: every rank of a run of up to "
        "64, else each stage's median and slowest rank, or those asked for with `ranks`"
    )
    spans: list[SpanOut]
    breakdown: list[RankBreakdownOut] = Field(
        description="every rank's, in rank order; with `breakdown_limit`, that many of slowest compute first"
    )
    breakdown_ranks: int = Field(description="how many ranks have a breakdown (the list may hold fewer)")
    span_sample_ranks: int | None = Field(
        description="how many ranks' spans were read (a run past 2,048 ranks: a sample of replicas, "
        "analysis/sampling.py); null: every rank's"
    )
    bubble: StepBubbleOut
