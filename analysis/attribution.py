"""Why the bubble is as large as it is: the measured bubble split into named causes that add up.

Algorithm, for a run's steps (all times are per-rank means, ns):
1. measured bubble = median over steps of ``StepBubble.measured_fraction × wall`` (as the step time is a
   median: one step the host stalled does not move it);
2. schedule-inherent = the replay's idle with every stage at the mean measured stage cost and free
   communication — for equal stages that is exactly the schedule's closed form (``schedules.py``);
3. stage imbalance = the replay's idle with the *measured* stage costs (the simulated floor), minus 2;
4. communication wait = the replay's idle with the measured transfer latency too, minus 3;
5. straggler / jitter = measured minus 4: what the medians cannot explain — micro-batches or steps
   slower than their median, per-action overhead, other work on the host.
Each cause is reported in ns and as a fraction of the measured step; they sum to the measured bubble.
The levels 2-4 are cut at the measured bubble, so no cause is negative: where the replay idles more
than was measured (its median stage costs and transfer overstate this run), the excess is reported on
its own (``replay_excess_ns``) instead of as a negative straggler/jitter.

Stage imbalance is also described: the slowest stage (forward + backward per micro-batch), its
excess over the mean stage, and, when the run reports layers per stage, the balanced split with the
moves that reach it and the replay's step time after them. Layers move in whole units, so the best split can
take less off the slowest stage than its measured cost is known to; moves are named only when the cut (the
costliest stage priced at the current split less at the balanced one, both on the same per-layer costs)
exceeds the 95% range of the slowest stage's median cost (``MeasuredPipeline.stage_noise_ns``), or takes at
least half its excess over the mean off it (``MOVE_SHARE_OF_EXCESS``). Without that hysteresis a run re-split
as suggested could be answered by the opposite move: a stage 14% above the mean after a 3+3 split, where 4+2
would leave the other stage about as far above it, read as a move from one loaded re-run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from bubblescope.analysis.pipeline_profile import MeasuredPipeline
from bubblescope.analysis.schedules import closed_form_bubble
from bubblescope.analysis.simulator import PipelineSetup, StageCost, simulate
from bubblescope.analysis.whatif import Change, balanced_split, predict, split_costs


@dataclass(frozen=True)
class CauseKind:
    """A cause of the bubble the attribution names: its name in the API, its label on every page, and what
    it stands for (each cause's explanation). The dashboard's colour for each: ``backend/web/bubble_causes.py``."""

    name: str
    label: str
    explanation: str


SCHEDULE_INHERENT = CauseKind(
    "schedule_inherent",
    "schedule-inherent",
    "the schedule's own warm-up and cool-down with equal stages (closed form)",
)
STAGE_IMBALANCE = CauseKind(
    "stage_imbalance", "stage imbalance", "stages of unequal cost: the others wait for the slowest"
)
COMMUNICATION_WAIT = CauseKind(
    "communication_wait", "communication wait", "activations and gradients in transit between stages"
)
MESH_COLLECTIVE_WAIT = CauseKind(
    "mesh_collective_wait",
    "waits in dp/tp collectives",
    "ranks waiting for their peers inside data- or tensor-parallel collectives, outside the pipeline",
)
STRAGGLER_JITTER = CauseKind(
    "straggler_jitter",
    "straggler / jitter",
    "slower-than-median micro-batches and steps, per-action overhead, other load on the hosts",
)
CAUSE_KINDS: tuple[CauseKind, ...] = (
    SCHEDULE_INHERENT,
    STAGE_IMBALANCE,
    COMMUNICATION_WAIT,
    MESH_COLLECTIVE_WAIT,
    STRAGGLER_JITTER,
)
"""Every cause, in the order an attribution lists them."""


@dataclass(frozen=True)
class Cause:
    name: str
    ns: float
    fraction_of_step: float
    explanation: str


@dataclass(frozen=True)
class BubbleAttribution:
    step_ns: float
    measured_bubble_ns: float
    measured_bubble_fraction: float
    closed_form_fraction: float | None
    closed_form_formula: str | None
    simulated_floor_fraction: float  # the replayed pipeline step's idle share: schedule and stage costs alone
    simulated_floor_ns: float  # that idle, mean per rank per step: what the measured bubble compares with
    causes: tuple[Cause, ...]
    replay_excess_ns: float  # how much more the replay (with transfers) idles than was measured; 0 mostly
    above_floor_fraction: float = 0.0  # (measured bubble - simulated floor) in ns, over the run's step


MOVE_SHARE_OF_EXCESS = 0.5
"""A move that takes at least this share of the slowest stage's excess over the mean off it is named even where
the stage's cost is known less well than the cut (with the band alone, a loaded CI run of 5+1 layers, 50-61% above
the mean in trials, named no move); a smaller one must clear the band."""


@dataclass(frozen=True)
class LayerMove:
    layers: int
    from_stage: int
    to_stage: int


@dataclass(frozen=True)
class StageImbalance:
    stage_cost_ns: tuple[float, ...]  # forward + backward per micro-batch, per (virtual) stage
    slowest_stage: int
    slowest_excess: float  # slowest / mean - 1
    layers_per_stage: tuple[int, ...] | None
    balanced_layers: tuple[int, ...] | None
    moves: tuple[LayerMove, ...]
    balanced_step_ns: float | None
    excess_ns: float = 0.0
    """The slowest stage's cost per micro-batch above the mean: the work to move out of it, in time
    (what can be said without layer counts)."""
    balanced_excess: float | None = None
    """The slowest stage over the mean, less 1, that the balanced split is predicted to leave: the bound a
    re-run with it should come within."""
    balanced_cut_ns: float = 0.0
    """What the balanced split takes off the costliest stage per micro-batch (both priced on the same
    per-layer costs); 0 without a different split."""
    noise_ns: float = 0.0
    """The 95% range of the slowest stage's median cost: a cut within it names no move, unless it takes half the
    excess off (``MOVE_SHARE_OF_EXCESS``; 0: not measured)."""


def attribute_bubble(
    measured: MeasuredPipeline, measured_bubble_ns: float, step_ns: float, mesh_wait_ns: float | None = None
) -> BubbleAttribution:
    """``mesh_wait_ns``: the mean wait per rank and step for peers inside collectives over a mesh dimension
    other than the pipeline's (a data-parallel gradient all-reduce, a tensor-parallel all-reduce), which the
    replay does not model; None for a run without such collectives. It is carved out of what the replay
    leaves unexplained, as its own cause, before straggler/jitter."""
    setup = replace(measured.setup, p2p_ns=0.0, action_overhead_ns=0.0)
    mean_cost = _mean_cost(setup.stage_costs)
    inherent = _mean_idle(replace(setup, stage_costs=(mean_cost,) * len(setup.stage_costs)))
    floor = simulate(setup)
    floor_idle = sum(floor.idle_ns) / setup.ranks
    with_comm = _mean_idle(replace(setup, p2p_ns=measured.setup.p2p_ns))
    levels = [min(level, measured_bubble_ns) for level in (0.0, inherent, floor_idle, with_comm, measured_bubble_ns)]
    explained = [SCHEDULE_INHERENT, STAGE_IMBALANCE, COMMUNICATION_WAIT, STRAGGLER_JITTER]
    parts = [(kind.name, max(0.0, hi - lo), kind.explanation) for kind, lo, hi in zip(explained, levels, levels[1:])]
    if mesh_wait_ns is not None:
        name, residual, why = parts[-1]
        mesh = min(residual, max(0.0, mesh_wait_ns))
        parts[-1:] = [
            (MESH_COLLECTIVE_WAIT.name, mesh, MESH_COLLECTIVE_WAIT.explanation),
            (name, residual - mesh, why),
        ]
    closed = closed_form_bubble(setup.schedule, setup.ranks, setup.microbatches, setup.stages_per_rank)
    return BubbleAttribution(
        step_ns=step_ns,
        measured_bubble_ns=measured_bubble_ns,
        measured_bubble_fraction=measured_bubble_ns / step_ns if step_ns else 0.0,
        closed_form_fraction=closed.fraction if closed else None,
        closed_form_formula=closed.formula if closed else None,
        # one method: the share of the replayed pipeline step (measured stage costs; no transfers, overheads or
        # jitter) its schedule leaves idle. It depends on the stage costs' ratios only, so identical jobs get the
        # same floor whatever else their step holds; the comparison with the measured bubble is in ns.
        simulated_floor_fraction=floor.bubble_fraction,
        simulated_floor_ns=floor_idle,
        above_floor_fraction=(measured_bubble_ns - floor_idle) / step_ns if step_ns else 0.0,
        causes=tuple(Cause(name, ns, ns / step_ns if step_ns else 0.0, why) for name, ns, why in parts),
        replay_excess_ns=max(0.0, max(inherent, floor_idle, with_comm) - measured_bubble_ns),
    )


def stage_imbalance(measured: MeasuredPipeline) -> StageImbalance:
    costs = tuple(c.forward_ns + c.backward_ns for c in measured.setup.stage_costs)
    mean = sum(costs) / len(costs)
    slowest = max(range(len(costs)), key=costs.__getitem__)
    layers = measured.layers_per_stage
    balanced: tuple[int, ...] | None = None
    balanced_step: float | None = None
    balanced_excess: float | None = None
    cut = 0.0
    noise = measured.stage_noise_ns[slowest] if measured.stage_noise_ns else 0.0
    moves: tuple[LayerMove, ...] = ()
    if measured.layer_costs is not None and layers is not None:
        own = measured.stage_layers.own_totals(len(costs)) if measured.stage_layers is not None else None
        balanced = balanced_split(measured.layer_costs, len(costs), own)
        if balanced != layers:
            prediction = predict(measured, Change(layers_per_stage=balanced))
            balanced_excess = _excess(_totals(prediction.stage_costs))
            cut = max(_totals(split_costs(measured, layers))) - max(_totals(prediction.stage_costs))
            if cut > noise or cut >= MOVE_SHARE_OF_EXCESS * (costs[slowest] - mean):
                moves = layer_moves(layers, balanced)
                balanced_step = prediction.step_ns
    return StageImbalance(
        costs,
        slowest,
        _excess(list(costs)),
        layers,
        balanced,
        moves,
        balanced_step,
        costs[slowest] - mean,
        balanced_excess,
        cut,
        noise,
    )


def _totals(costs: tuple[StageCost, ...]) -> list[float]:
    return [c.forward_ns + c.backward_ns for c in costs]


def _excess(costs: list[float]) -> float:
    """The costliest over the mean, less 1."""
    mean = sum(costs) / len(costs)
    return max(costs) / mean - 1 if mean else 0.0


def layer_moves(current: tuple[int, ...], target: tuple[int, ...]) -> tuple[LayerMove, ...]:
    """Moves of layers across each stage boundary that turn ``current`` into ``target``."""
    moves = []
    before = after = 0
    for boundary in range(len(current) - 1):
        before += current[boundary]
        after += target[boundary]
        if after < before:  # stage `boundary` hands its last layers to the next stage
            moves.append(LayerMove(before - after, boundary, boundary + 1))
        elif after > before:
            moves.append(LayerMove(after - before, boundary + 1, boundary))
    return tuple(moves)


def _mean_idle(setup: PipelineSetup) -> float:
    result = simulate(setup)
    return sum(result.idle_ns) / setup.ranks


def _mean_cost(costs: tuple[StageCost, ...]) -> StageCost:
    n = len(costs)
    weights = [c.weight_ns for c in costs]
    weight = None if any(w is None for w in weights) else sum(w for w in weights if w is not None) / n
    return StageCost(sum(c.forward_ns for c in costs) / n, sum(c.backward_ns for c in costs) / n, weight)
