"""API shapes of a run's analysis and of what-if replays: the API's own models, filled from the
analysis dataclasses (``from_attributes``) so the analysis can change inside without the API moving."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict

from bubblescope.analysis import NAMES
from bubblescope.backend.fields import STEP_MAX, FromAnalysis

Count = Annotated[int, Strict(), Field(ge=1, le=100_000)]


class StageBreakdownOut(FromAnalysis):
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


class StageMemoryOut(FromAnalysis):
    """A stage's memory over the analysed steps: its fullest rank's highest per-step peak."""

    stage: int | None
    ranks: int = Field(description="ranks of the stage that sent memory readings")
    source: str = Field(
        description="gpu_reserved: the CUDA allocator's peak reserved bytes; host_rss: peak resident set"
    )
    peak_bytes: int
    peak_rank: int = Field(description="the rank with that peak")
    median_bytes: float = Field(description="median over the stage's ranks of each one's peak")
    gpu_peak_allocated_bytes: int | None
    gpu_alloc_retries: int = Field(description="the allocator's retries (cache flushed to fit), summed")
    limit_bytes: int | None = Field(description="the smallest memory limit its ranks registered")
    fraction_of_limit: float | None
    predicted_bytes: float | None = Field(description="the planner's bytes per GPU here, for the run's declared model")
    nearest_limit: bool = Field(description="the stage with the highest peak over limit (over bytes without limits)")


class StageCostOut(FromAnalysis):
    """One (virtual) stage's cost per micro-batch, ns; ``weight_ns`` is the weight-gradient part of a
    split backward (zero-bubble schedules), null when not measured."""

    forward_ns: float
    backward_ns: float
    weight_ns: float | None


class PipelineSetupOut(FromAnalysis):
    schedule: str
    ranks: int
    microbatches: int
    stage_costs: list[StageCostOut] = Field(description="one per virtual stage, in stage order")
    stages_per_rank: int
    p2p_ns: float = Field(description="transfer latency of a pipeline recv that waited for its send")
    action_overhead_ns: float = Field(description="the schedule's own cost per action, fitted to the measured step")
    step_overhead_ns: float = Field(description="outside the pipeline: data loading, optimizer, gradient all-reduce")


class StageLayersOut(FromAnalysis):
    layers: list[list[StageCostOut]] = Field(
        description="per stage, each layer's forward and backward per micro-batch, as timed layer by layer"
    )
    own: list[StageCostOut] = Field(
        description="per stage, its action's cost less its layers': what it computes outside them (runtime, "
        "embedding, head, loss), which stays on it when layers move"
    )


class MeasuredPipelineOut(FromAnalysis):
    setup: PipelineSetupOut
    layers_per_stage: list[int] | None
    measured_step_ns: float
    steps_used: int
    fixed_cost: StageCostOut = Field(description="per action, whatever its layers and micro-batch size")
    overhead_per_layer_ns: float = Field(description="step overhead per layer of the rank holding the most")
    stage_layers: StageLayersOut | None = Field(
        default=None, description="the stages' layers timed one by one (None: not timed; costs spread evenly)"
    )
    stage_noise_ns: list[float] = Field(
        default_factory=list,
        description="per (virtual) stage, the 95% range of its forward + backward median (each kind's "
        "1.96·1.4826·MAD·sqrt(pi/2)/sqrt(n), in quadrature): how far the stage's cost is known",
    )


class CauseOut(FromAnalysis):
    name: str
    ns: float
    fraction_of_step: float
    explanation: str


class BubbleAttributionOut(FromAnalysis):
    step_ns: float
    measured_bubble_ns: float
    measured_bubble_fraction: float
    closed_form_fraction: float | None
    closed_form_formula: str | None
    simulated_floor_fraction: float = Field(
        description="the idle share of the replayed pipeline step: the schedule with the measured stage costs, no "
        "transfers, overheads or jitter (one method: identical jobs get the same floor, whatever else their step holds)"
    )
    simulated_floor_ns: float = Field(description="that idle, mean per rank per step")
    above_floor_fraction: float = Field(
        description="(measured_bubble_ns - simulated_floor_ns) / step_ns: how far the bubble is above its floor, "
        "over the run's step (negative: the replay overstates this run)"
    )
    causes: list[CauseOut] = Field(description="add up to the measured bubble; none is negative")
    replay_excess_ns: float = Field(
        description="how much more the replay idles (measured median stage costs and transfer) than was measured "
        "per rank per step; where above 0 the causes are cut at the measurement and the floor overstates this run"
    )


class LayerMoveOut(FromAnalysis):
    layers: int
    from_stage: int
    to_stage: int


class StageImbalanceOut(FromAnalysis):
    stage_cost_ns: list[float] = Field(description="forward + backward per micro-batch, per (virtual) stage")
    slowest_stage: int
    slowest_excess: float = Field(description="slowest / mean - 1")
    layers_per_stage: list[int] | None
    balanced_layers: list[int] | None
    moves: list[LayerMoveOut]
    balanced_step_ns: float | None
    excess_ns: float = Field(
        description="the slowest stage's cost per micro-batch above the mean: the work to move out"
    )
    balanced_excess: float | None = Field(
        default=None,
        description="slowest / mean - 1 that the balanced split is predicted to leave (each stage's own work, "
        "such as the loss or the head, staying where it is): the bound a re-run with it should come within",
    )
    balanced_cut_ns: float = Field(
        default=0.0,
        description="what the balanced split takes off the costliest stage per micro-batch, both splits priced on "
        "the same per-layer costs; moves are named only when it exceeds noise_ns or half of excess_ns",
    )
    noise_ns: float = Field(
        default=0.0,
        description="the 95% range of the slowest stage's median cost (forward + backward, from the spread of its "
        "spans; 0: not measured): a cut within it names no move unless it is half of excess_ns or more",
    )


class SuggestionOut(FromAnalysis):
    kind: str
    title: str
    evidence: str
    current_step_ns: float
    predicted_step_ns: float
    predicted_bubble_fraction: float | None
    gain_fraction: float
    memory_cost: str
    apply: dict[str, Any] = Field(description="the run-config keys to change: everything the prediction assumed")
    torch_pipelining: str | None
    torchtitan: dict[str, Any]
    megatron: list[str]
    gain_half_width_ns: float = Field(
        description="the predicted gain's 95% interval is +- this: one step's 95% range in this run (1.96 sigma "
        "from the steps' MAD), plus the replay's measured error (docs/analysis.md)"
    )
    within_noise: bool = Field(
        description="the gain does not clear that interval: listed after the others, not a call to act"
    )


class StepPartOut(FromAnalysis):
    name: str = Field(
        description="model_compute, optimizer, data_loading, collective_wait, collective_transfer, host_gaps"
    )
    ns: float = Field(description="mean per rank per step")
    fraction_of_step: float = Field(description="of the ranks' mean window")


class GroupTimeOut(FromAnalysis):
    group: str
    exposed_ns: float = Field(
        description="communication over the group with no compute under it, mean per rank per step"
    )
    wait_ns: float = Field(description="of it, before the call's last member arrived")
    transfer_ns: float


class CulpritOut(FromAnalysis):
    rank: int
    host: str | None
    caused_ns: float = Field(description="its peers' waits for it in the collectives, summed over them, per step")
    share: float = Field(description="of every wait in the collectives")
    victims: list[int] = Field(description="the ranks that waited in the collectives")
    lateness_ns: float = Field(description="each victim's exposed wait for it, per step: what the step would shrink by")


class StepSplitOut(FromAnalysis):
    """Where the step of a job without a pipeline goes: no bubble, the job's own terms."""

    window_ns: float = Field(description="the ranks' mean window per step")
    parts: list[StepPartOut] = Field(description="add up to the window")
    groups: list[GroupTimeOut] = Field(description="exposed communication per group, largest first")
    compute_instrumented: bool = Field(description="false: no forward or backward was recorded")
    not_instrumented: str | None = Field(description="what to add when compute_instrumented is false")
    culprit: CulpritOut | None = Field(description="the rank the others wait for in the collectives, if one is")
    shared_gaps_ns: float = Field(
        description="the host gaps every rank has (per step, the least of any rank's), mean per step: one rank's "
        "gaps beyond that are its own, which its peers wait for"
    )


class BlockCostOut(FromAnalysis):
    """One block of an instrumented model (``instrument_model(model, blocks=...)``), or one layer of a pipeline
    stage (timed by the pipelining integration), per step."""

    block: str = Field(description="its name in the model (layers.0); a stage's layer: stage1:layers.12")
    stage: int | None = Field(default=None, description="the pipeline stage holding it (a stage's layer), else None")
    forward_ns: float = Field(description="its forward per step: the median over ranks of each rank's median step")
    backward_ns: float = Field(description="its backward per step, the same way")
    share_of_model: float | None = Field(description="forward + backward over the model's own compute per step")
    slowest_rank: int = Field(description="the rank on which it costs most")
    slowest_ns: float = Field(description="its forward + backward per step on that rank")


class AnalysisOut(BaseModel):
    run_key: str
    steps: list[int] = Field(
        description="the steps analysed: those with spans in the range, the partial and (unless from_step is given) "
        "warm-up ones left out where others exist, and steps_from_aggregates; at most the newest 50"
    )
    partial_steps_left_out: list[int] = Field(
        description="steps with spans in the range left out because not every rank reported them (a crash, or "
        "batches still arriving)"
    )
    warmup_steps_left_out: list[int] = Field(description="steps with spans in the range left out as the run's warm-up")
    steps_from_aggregates: list[int] = Field(
        description="of steps, those analysed from their per-step aggregates (no spans): where fewer than 10 steps "
        "with spans are past the warm-up, every complete step past it is analysed"
    )
    step_ns: float = Field(description="median step wall time over those steps")
    step_bubble_fractions: list[float] = Field(
        description="each analysed step's measured bubble, a fraction of its wall time (same order as steps)"
    )
    stages: list[StageBreakdownOut]
    memory: list[StageMemoryOut] = Field(description="memory per stage; empty when the collector sent no readings")
    exposed_comm_ns_by_group: dict[str, float] = Field(description="mean per rank per step, pipeline p2p excluded")
    pipeline: MeasuredPipelineOut | None = Field(description="the run in the simulator's terms")
    pipeline_unavailable: str | None = Field(
        description="why a run that registered a pipeline has no replay; null with a replay, and for a run without one"
    )
    attribution: BubbleAttributionOut | None
    imbalance: StageImbalanceOut | None
    layers_source: str | None = Field(
        description="where the layers per stage come from: declared (the run's config), counted (by the collector in "
        "each stage's module); null: unknown, so imbalance is said in time only"
    )
    params_per_stage: list[int] | None = Field(description="parameters of each stage, as the collector counted them")
    suggestions: list[SuggestionOut] = Field(description="ranked by predicted gain")
    step_split: StepSplitOut | None = Field(
        description="a run that registered no pipeline: where its step goes (pipeline, attribution and imbalance "
        "are then null)"
    )
    advice_withheld: str | None = Field(
        default=None, description="why suggestions is empty: too few steps analysed to price a fix (null otherwise)"
    )
    block_costs: list[BlockCostOut] = Field(
        default_factory=list,
        description="each instrumented block's cost, in the order they run forward; empty when no block was",
    )


class WhatIfIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schedule: str | None = Field(default=None, description=f"{', '.join(NAMES)}, or torch's class name")
    microbatches: Count | None = None
    microbatch_scale: Annotated[float, Field(gt=0, le=1000)] = Field(
        default=1.0, description="scale of every action's duration: b'/b for another micro-batch size"
    )
    stages_per_rank: Annotated[int, Strict(), Field(ge=1, le=64)] | None = None
    layers_per_stage: Annotated[list[Count], Field(min_length=1, max_length=4096)] | None = None
    slowest_rank_to_median: Annotated[bool, Strict()] = False  # 0 and 1 are not booleans
    overlap_communication: Annotated[bool, Strict()] = False
    from_step: Annotated[int, Strict(), Field(ge=0, le=STEP_MAX)] | None = None
    to_step: Annotated[int, Strict(), Field(ge=0, le=STEP_MAX)] | None = None


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
    samples_per_step_ratio: float = Field(
        description="samples a step processes after the change over today's: microbatches × microbatch_scale "
        "over today's micro-batches (1: the global batch is held)"
    )
    global_batch_held: bool = Field(description="whether the change keeps the samples per step (the global batch)")
