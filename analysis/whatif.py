"""What-if questions answered by replaying a measured run with one thing changed.

Each answer starts from ``MeasuredPipeline.setup`` (measured stage costs, transfer latency, the
fitted per-action overhead, the step's non-pipeline time) and changes only what was asked:
- another number of micro-batches (``microbatches``); ``microbatch_scale`` scales every action's
  duration less its fixed part (b'/b when the global batch stays and micro-batches shrink, 1 when
  they keep their size);
- another schedule and stages per rank; layers are re-cut into p·v contiguous blocks of equal cost;
- layers moved between stages (``layers_per_stage``): the fixed part plus the measured per-layer cost, or,
  where the layers were timed one by one, each stage's own work plus its layers' (``stage_layers``); the
  step overhead's per-layer part follows the layers of the rank holding the most;
- the slowest rank made median (its stages take the median stage's cost);
- communication fully overlapped (no transfer latency).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from bubblescope.analysis.pipeline_profile import MeasuredPipeline, _minus, _scaled
from bubblescope.analysis.schedules import Schedule, ScheduleError, lookup
from bubblescope.analysis.simulator import SimulationResult, StageCost, simulate


@dataclass(frozen=True)
class Change:
    schedule: str | None = None
    microbatches: int | None = None
    microbatch_scale: float = 1.0
    stages_per_rank: int | None = None
    layers_per_stage: tuple[int, ...] | None = None
    slowest_rank_to_median: bool = False
    overlap_communication: bool = False


@dataclass(frozen=True)
class Prediction:
    schedule: str
    microbatches: int
    stages_per_rank: int
    layers_per_stage: tuple[int, ...] | None
    step_ns: float
    bubble_fraction: float
    peak_activations: int
    result: SimulationResult
    stage_costs: tuple[StageCost, ...] = ()  # per (virtual) stage, as replayed


def predict(measured: MeasuredPipeline, change: Change) -> Prediction:
    base = measured.setup
    chosen = lookup(change.schedule or base.schedule)
    schedule = chosen.name
    # Stages per rank: as asked, else the run's own when it interleaves, else the schedule's default.
    kept = base.stages_per_rank if base.stages_per_rank > 1 and chosen.placement == "loop" else None
    v = chosen.stages_per_rank(change.stages_per_rank or kept)
    m = 1 if chosen.min_microbatches == "one" else change.microbatches or base.microbatches
    stages = base.ranks * v
    layers = change.layers_per_stage
    if layers is not None and len(layers) != stages:
        raise ScheduleError("layers_per_stage", f"{stages} stages need {stages} counts, got {len(layers)}")
    costs, layers = _stage_costs(measured, stages, layers)
    fixed = measured.fixed_cost
    costs = tuple(_plus(fixed, _scaled(_minus(cost, fixed), change.microbatch_scale)) for cost in costs)
    if change.slowest_rank_to_median:
        costs = _slowest_rank_to_median(costs, chosen, base.ranks)
    setup = replace(
        base,
        schedule=schedule,
        microbatches=m,
        stages_per_rank=v,
        stage_costs=costs,
        p2p_ns=0.0 if change.overlap_communication else base.p2p_ns,
        step_overhead_ns=_step_overhead(measured, schedule, layers),
    )
    result = simulate(setup)
    return Prediction(
        schedule, m, v, layers, result.step_ns, result.bubble_fraction, max(result.peak_activations), result, costs
    )


def split_costs(measured: MeasuredPipeline, layers: tuple[int, ...]) -> tuple[StageCost, ...]:
    """Each stage's cost (forward + backward per micro-batch) with the run's layers split as ``layers``, priced as
    ``predict`` prices them at the run's micro-batch size, without replaying the schedule."""
    return _stage_costs(measured, len(layers), layers)[0]


def _step_overhead(measured: MeasuredPipeline, schedule: str, layers: tuple[int, ...] | None) -> float:
    """The measured step overhead, its per-layer part moved to the new largest rank's layers."""
    overhead = measured.setup.step_overhead_ns
    if layers is None or measured.layers_per_stage is None or not measured.overhead_per_layer_ns:
        return overhead
    before = max(measured.rank_layers(measured.layers_per_stage))
    after = max(measured.rank_layers(layers, schedule))
    return max(0.0, overhead + measured.overhead_per_layer_ns * (after - before))


def balanced_split(
    layer_costs: tuple[StageCost, ...], stages: int, own: Sequence[float] | None = None
) -> tuple[int, ...]:
    """Contiguous layer counts per stage minimising the costliest stage (forward + backward), a stage costing
    its ``own`` work (what it computes outside its layers, ns; 0 when not given) plus its layers'.

    The classic partition programme, best[k][i] = min over j of max(best[k-1][j], cost of layers
    j..i), with the inner minimum found by bisection in O(log n) instead of a scan: best[k-1][j]
    never falls as j grows (weights are not negative) and the last stage's cost never rises, so
    the maximum is smallest where the two cross. Ties go to the smallest j, as a scan would take
    them. O(stages x layers x log layers)."""
    weights = [c.forward_ns + c.backward_ns for c in layer_costs]
    n = len(weights)
    if stages > n:
        raise ScheduleError("layers_per_stage", f"{n} layers cannot fill {stages} stages")
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    extra = list(own) if own is not None else [0.0] * stages
    for k in range(1, stages + 1):
        before = best[k - 1]
        for i in range(k, n - (stages - k) + 1):
            best[k][i], cut[k][i] = _best_cut(before, prefix, i, k - 1, i - 1, extra[k - 1])
    counts, i = [], n
    for k in range(stages, 0, -1):
        j = cut[k][i]
        counts.append(i - j)
        i = j
    return tuple(reversed(counts))


def _best_cut(
    before: list[float], prefix: list[float], i: int, lo: int, hi: int, own: float = 0.0
) -> tuple[float, int]:
    """min over j in [lo, hi] of max(before[j], own + prefix[i] - prefix[j]), and the smallest such j."""
    low, high = lo, hi + 1  # the first j where before[j] >= the last stage's cost
    while low < high:
        mid = (low + high) // 2
        if before[mid] >= own + prefix[i] - prefix[mid]:
            high = mid
        else:
            low = mid + 1
    crossing = low
    best, where = float("inf"), hi
    if crossing > lo:  # left of the crossing the last stage dominates: the first j within 1e-9 of its least
        least = prefix[i] - prefix[crossing - 1]
        low, high = lo, crossing - 1
        while low < high:
            mid = (low + high) // 2
            if prefix[i] - prefix[mid] <= least + 1e-9:
                high = mid
            else:
                low = mid + 1
        best, where = own + prefix[i] - prefix[low], low
    if crossing <= hi and before[crossing] < best - 1e-9:
        best, where = before[crossing], crossing
    return best, where


def _stage_costs(
    measured: MeasuredPipeline, stages: int, layers: tuple[int, ...] | None
) -> tuple[tuple[StageCost, ...], tuple[int, ...] | None]:
    base = measured.setup.stage_costs
    if layers is None and stages == len(base):
        return base, measured.layers_per_stage
    per_layer = measured.layer_costs
    if per_layer is None:
        if layers is not None:
            raise ScheduleError("layers_per_stage", "the run did not report its layers per stage")
        per_layer = _even_pieces(base, stages)  # no layer counts: stages re-cut into equal pieces
        layers = (len(per_layer) // stages,) * stages
    elif layers is None:
        own = measured.stage_layers.own_totals(stages) if measured.stage_layers is not None else None
        layers = balanced_split(per_layer, stages, own)
    if sum(layers) != len(per_layer):
        raise ScheduleError(
            "layers_per_stage", f"the run has {len(per_layer)} layers, the split {layers} has {sum(layers)}"
        )
    costs, start = [], 0
    fixed = measured.fixed_cost if measured.layer_costs is not None else StageCost(0.0, 0.0)
    for index, count in enumerate(layers):
        own_work = fixed if measured.stage_layers is None else measured.stage_layers.own_work(index, len(layers))
        costs.append(_plus(own_work, _sum_costs(per_layer[start : start + count])))
        start += count
    return tuple(costs), layers if measured.layer_costs is not None else None


def _plus(fixed: StageCost, cost: StageCost) -> StageCost:
    weight = None if cost.weight_ns is None else cost.weight_ns + (fixed.weight_ns or 0.0)
    return StageCost(fixed.forward_ns + cost.forward_ns, fixed.backward_ns + cost.backward_ns, weight)


def _even_pieces(costs: tuple[StageCost, ...], stages: int) -> tuple[StageCost, ...]:
    pieces = stages // len(costs) if stages % len(costs) == 0 else 0
    if pieces:
        return tuple(_scaled(cost, 1 / pieces) for cost in costs for _ in range(pieces))
    if len(costs) % stages == 0:
        return costs
    raise ScheduleError(
        "stages_per_rank",
        f"{len(costs)} measured stages cannot be re-cut into {stages} without the run's layers per stage",
    )


def _sum_costs(block: tuple[StageCost, ...]) -> StageCost:
    weights = [c.weight_ns for c in block]
    return StageCost(
        sum(c.forward_ns for c in block),
        sum(c.backward_ns for c in block),
        None if any(w is None for w in weights) else sum(w for w in weights if w is not None),
    )


def _slowest_rank_to_median(costs: tuple[StageCost, ...], schedule: Schedule, ranks: int) -> tuple[StageCost, ...]:
    """The slowest rank's stages scaled so that its load (F+B over its stages) is the median rank's."""
    load = [0.0] * ranks
    for stage, cost in enumerate(costs):
        load[schedule.stage_rank(ranks, stage)] += cost.forward_ns + cost.backward_ns
    slowest = max(range(ranks), key=load.__getitem__)
    median_load = statistics.median(load)
    if load[slowest] <= median_load:
        return costs
    factor = median_load / load[slowest]
    return tuple(
        _scaled(cost, factor) if schedule.stage_rank(ranks, stage) == slowest else cost
        for stage, cost in enumerate(costs)
    )
