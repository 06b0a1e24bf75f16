"""What a measured pipeline run costs, in the simulator's terms, read from its spans.

Algorithm (over the steps given; callers leave out step 0, which warms up):
1. Stage costs: per (virtual) stage, the median duration of its forward, backward (or
   backward_input + backward_weight) spans, and how far each median is known (``stage_noise_ns``).
2. Transfer latency: for each recv that waited for its peer (the matching send started after the
   recv began, see ``breakdown.dependency_waits``), recv end - send start; the median over them.
   When stages hold different numbers of layers, each action's fixed part (the intercept of
   cost = fixed + layers × per-layer cost) is estimated too; moved layers and other micro-batch
   sizes change only the rest. Where the stages' layers were timed one by one, each layer's own cost
   and each stage's own work replace the even spread (``stage_layers``).
3. Step overhead: per step, the step's wall time minus the pipeline's (first pipeline span to last,
   over all ranks): data loading, gradient all-reduce, optimizer. The median over steps. Part of
   it grows with the layers a rank holds (clipping and optimizer work on its parameters): per
   rank, its window less its pipeline's extent and the communication outside it; when ranks hold
   different numbers of layers, the slope of that time over their layer counts is the per-layer
   part, which a replay with other layer counts scales by the largest rank's (the rank that ends
   the step).
4. Per-action overhead: what the schedule itself costs per action (posting p2p ops, Python) — the
   one figure fitted: bisection on it until the replay of the measured configuration gives the
   measured median step time. A run that the replay already over-predicts gets 0.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from bubblescope import intervals, wire
from bubblescope.analysis.breakdown import MatchedRecv, matched_recvs
from bubblescope.analysis.errors import InputError
from bubblescope.analysis.model import TimedSpan
from bubblescope.analysis.schedules import lookup
from bubblescope.analysis.simulator import PipelineSetup, StageCost, simulate
from bubblescope.analysis.spread import median_range95
from bubblescope.analysis.stage_layers import LayerDurations, StageLayers, add_layer_spans, stage_layers

PIPELINE_COMPUTE = {"forward": "F", "backward": "B", "backward_input": "I", "backward_weight": "W"}


@dataclass(frozen=True)
class StepSpans:
    """One step's aligned spans and each rank's window; ``matched``: ``matched_recvs(spans)``, where the
    caller already has them."""

    step: int
    spans: Sequence[TimedSpan]
    windows: Mapping[int, tuple[int, int]]
    matched: Sequence[MatchedRecv] | None = None


@dataclass(frozen=True)
class MeasuredPipeline:
    """A run's pipeline in the simulator's terms; ``setup`` replays the measured configuration."""

    setup: PipelineSetup
    layers_per_stage: tuple[int, ...] | None
    measured_step_ns: float
    steps_used: int
    fixed_cost: StageCost = StageCost(0.0, 0.0)  # noqa: RUF009 (frozen: shared safely)  per action, whatever its layers and micro-batch size
    overhead_per_layer_ns: float = 0.0  # step overhead per layer of the rank holding the most
    stage_layers: StageLayers | None = None  # each layer's measured cost and each stage's own work
    stage_noise_ns: tuple[float, ...] = ()
    """Per (virtual) stage, the 95% range of its forward + backward median in ``setup`` (``spread.median_range95``
    of each kind's durations, added in quadrature): how far the stage's price is known. Empty when not measured."""

    def rank_layers(self, layers_per_stage: Sequence[int], schedule: str | None = None) -> tuple[int, ...]:
        """Layers each rank holds when its stages hold ``layers_per_stage`` under ``schedule``."""
        placed = lookup(schedule or self.setup.schedule)
        held = [0] * self.setup.ranks
        for stage, count in enumerate(layers_per_stage):
            held[placed.stage_rank(self.setup.ranks, stage)] += count
        return tuple(held)

    @property
    def layer_costs(self) -> tuple[StageCost, ...] | None:
        """Per-layer cost: as timed layer by layer (``stage_layers``), else each stage's cost less the fixed part,
        spread over its layers (None without layer counts)."""
        if self.stage_layers is not None:
            return self.stage_layers.flat
        if self.layers_per_stage is None:
            return None
        out: list[StageCost] = []
        for cost, layers in zip(self.setup.stage_costs, self.layers_per_stage):
            out += [_scaled(_minus(cost, self.fixed_cost), 1 / layers)] * layers
        return tuple(out)


class ProfileError(InputError):
    """The run lacks what a replay needs; the message says what."""


def measure_pipeline(steps: Sequence[StepSpans], config: Mapping[str, object]) -> MeasuredPipeline:
    schedule = config.get("schedule")
    num_stages = _positive_int(config.get("num_stages"))
    microbatches = _positive_int(config.get("num_microbatches"))
    if not isinstance(schedule, str) or num_stages is None or microbatches is None:
        raise ProfileError("config", "the run did not describe its pipeline (schedule, num_stages, num_microbatches)")
    v = _positive_int(config.get("virtual_stages")) or 1
    ranks = max(1, num_stages // v)
    if not steps:
        raise ProfileError("steps", "no step with spans in the range")
    durations: dict[tuple[int, str], list[int]] = defaultdict(list)
    latencies: list[int] = []
    outside: list[int] = []
    walls: list[int] = []
    own_outside: dict[int, list[int]] = defaultdict(list)
    layer_durations: LayerDurations = {}
    timed_durations: dict[tuple[int, str], list[int]] = defaultdict(list)  # actions of the steps timing layers
    for step in steps:
        timed = add_layer_spans(step.step, step.spans, layer_durations)
        for rank, ns in _own_outside_ns(step).items():
            own_outside[rank].append(ns)
        for span in step.spans:
            kind = PIPELINE_COMPUTE.get(span.kind)
            if kind and span.stage is not None:
                durations[(span.stage, kind)].append(span.end_ns - span.start_ns)
                if timed:
                    timed_durations[(span.stage, kind)].append(span.end_ns - span.start_ns)
        latencies += _waiting_recv_latencies(matched_recvs(step.spans) if step.matched is None else step.matched)
        wall = max(hi for _, hi in step.windows.values()) - min(lo for lo, _ in step.windows.values())
        pipeline = [s for s in step.spans if s.stage is not None]
        if pipeline:
            walls.append(wall)
            outside.append(wall - (max(s.end_ns for s in pipeline) - min(s.start_ns for s in pipeline)))
    if not walls:
        raise ProfileError("steps", "no pipeline spans (forward/backward with a stage) in the range")
    costs = tuple(_stage_cost(durations, stage) for stage in range(num_stages))
    setup = PipelineSetup(
        schedule=lookup(schedule).name,
        ranks=ranks,
        microbatches=microbatches,
        stage_costs=costs,
        stages_per_rank=v,
        p2p_ns=statistics.median(latencies) if latencies else 0.0,
        step_overhead_ns=statistics.median(outside),
    )
    measured = statistics.median(walls)
    layers = _layer_counts(config.get("layers_per_stage"), num_stages)
    profile = MeasuredPipeline(
        setup=_fit_action_overhead(setup, measured),
        layers_per_stage=layers,
        measured_step_ns=measured,
        steps_used=len(walls),
        fixed_cost=_fixed_cost(costs, layers),
        stage_layers=_stage_layers(layer_durations, timed_durations, num_stages, layers, microbatches),
        stage_noise_ns=tuple(_stage_noise(durations, stage) for stage in range(num_stages)),
    )
    if layers is None or len(own_outside) < ranks:
        return profile
    held = profile.rank_layers(layers)
    own = [statistics.median(own_outside[rank]) for rank in range(ranks)]
    return replace(profile, overhead_per_layer_ns=max(0.0, _slope(held, own)))


def _stage_layers(
    layer_durations: LayerDurations,
    timed_durations: Mapping[tuple[int, str], list[int]],
    num_stages: int,
    layers: tuple[int, ...] | None,
    microbatches: int,
) -> StageLayers | None:
    """``stage_layers`` over the steps that timed the layers (None where a stage has no action there)."""
    if not layer_durations:
        return None
    try:
        costs = tuple(_stage_cost(timed_durations, stage) for stage in range(num_stages))
    except ProfileError:
        return None
    return stage_layers(layer_durations, costs, layers, microbatches)


def _own_outside_ns(step: StepSpans) -> dict[int, int]:
    """Per rank: its window less its pipeline's extent and the communication outside that extent
    (what it computes itself outside the pipeline: data loading, clipping, optimizer)."""
    by_rank: dict[int, list[TimedSpan]] = defaultdict(list)
    for span in step.spans:
        by_rank[span.rank].append(span)
    out: dict[int, int] = {}
    for rank, (lo, hi) in step.windows.items():
        mine = by_rank.get(rank, [])
        pipeline = [s for s in mine if s.stage is not None]
        if not pipeline:
            continue
        first, last = min(s.start_ns for s in pipeline), max(s.end_ns for s in pipeline)
        comm = [(s.start_ns, s.end_ns) for s in mine if s.stage is None and s.kind in wire.COMMUNICATION_KINDS]
        waited = intervals.union_length(intervals.clip(comm, lo, first) + intervals.clip(comm, last, hi))
        out[rank] = max(0, (hi - lo) - (last - first) - waited)
    return out


def _slope(x: Sequence[int], y: Sequence[float]) -> float:
    """Least-squares slope of y over x; 0 when x does not vary."""
    mean_x, mean_y = statistics.mean(x), statistics.mean(y)
    spread = sum((a - mean_x) ** 2 for a in x)
    return sum((a - mean_x) * (b - mean_y) for a, b in zip(x, y)) / spread if spread else 0.0


def _fixed_cost(costs: tuple[StageCost, ...], layers: tuple[int, ...] | None) -> StageCost:
    """The part of an action that does not grow with its layers: the intercept of cost = fixed + layers·c.

    Only known when stages hold different numbers of layers (a least-squares line through them);
    kept within [0, the cheapest stage's cost]. It matters: the pipelining runtime spends about a
    millisecond per action on CPU whatever the action computes.
    """
    if layers is None or len(set(layers)) < 2:
        return StageCost(0.0, 0.0)

    def intercept(values: list[float]) -> float:
        slope = _slope(layers, values)
        return min(max(0.0, statistics.mean(values) - slope * statistics.mean(layers)), min(values))

    return StageCost(intercept([c.forward_ns for c in costs]), intercept([c.backward_ns for c in costs]))


def _stage_cost(durations: Mapping[tuple[int, str], list[int]], stage: int) -> StageCost:
    forward = durations.get((stage, "F"))
    if not forward:
        raise ProfileError("steps", f"stage {stage} has no forward span in the range")
    full = durations.get((stage, "B"))
    split_input, split_weight = durations.get((stage, "I")), durations.get((stage, "W"))
    if split_input and split_weight:
        weight = statistics.median(split_weight)
        return StageCost(statistics.median(forward), statistics.median(split_input) + weight, weight)
    if not full:
        raise ProfileError("steps", f"stage {stage} has no backward span in the range")
    return StageCost(statistics.median(forward), statistics.median(full))


def _stage_noise(durations: Mapping[tuple[int, str], list[int]], stage: int) -> float:
    """The 95% range of the stage's forward + backward median: each kind's own, in quadrature (the backward as
    one span or as its input and weight halves, as ``_stage_cost`` reads it)."""
    kinds = ("F", "I", "W") if durations.get((stage, "I")) and durations.get((stage, "W")) else ("F", "B")
    return math.sqrt(sum(median_range95(durations.get((stage, kind), [])) ** 2 for kind in kinds))


def _waiting_recv_latencies(matched: Sequence[MatchedRecv]) -> list[int]:
    """recv end - send start, for pipeline recvs that were posted before their send started."""
    return [
        recv.end_ns - started
        for recv, started in matched
        if recv.name in (wire.P2P_FORWARD, wire.P2P_BACKWARD) and recv.start_ns < started < recv.end_ns
    ]


def _fit_action_overhead(setup: PipelineSetup, measured_ns: float) -> PipelineSetup:
    def step_with(overhead: float) -> float:
        return simulate(_with_overhead(setup, overhead)).step_ns

    if step_with(0.0) >= measured_ns:
        return setup
    low, high = 0.0, max(c.forward_ns + c.backward_ns for c in setup.stage_costs) + 1.0
    while step_with(high) < measured_ns:
        high *= 2
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if step_with(middle) < measured_ns else (low, middle)
    return _with_overhead(setup, (low + high) / 2)


def _with_overhead(setup: PipelineSetup, overhead: float) -> PipelineSetup:
    return replace(setup, action_overhead_ns=overhead)


def _minus(cost: StageCost, fixed: StageCost) -> StageCost:
    return StageCost(cost.forward_ns - fixed.forward_ns, cost.backward_ns - fixed.backward_ns, cost.weight_ns)


def _scaled(cost: StageCost, factor: float) -> StageCost:
    weight = None if cost.weight_ns is None else cost.weight_ns * factor
    return StageCost(cost.forward_ns * factor, cost.backward_ns * factor, weight)


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


MAX_LAYERS = 1024
"""Layers in all stages together: the analysis prices and re-splits them one by one (O(stages x layers x
log layers)); transformer models have a few hundred at most."""


def _layer_counts(value: object, num_stages: int) -> tuple[int, ...] | None:
    each = _positive_int(value)
    counts: tuple[int, ...] | None = None
    if each is not None:
        counts = (each,) * num_stages
    elif isinstance(value, list) and len(value) == num_stages and all(_positive_int(x) for x in value):
        counts = tuple(value)
    if counts is not None and sum(counts) > MAX_LAYERS:
        raise ProfileError(
            "layers_per_stage", f"{sum(counts):,} layers in all; the analysis takes at most {MAX_LAYERS:,}"
        )
    return counts
