"""Discrete-event replay of a pipeline schedule: step time, per-rank idle, activations in flight.

Algorithm. Each rank runs its actions (``schedules.Schedule.build_orders``) strictly in order, one at a
time. An action starts when its rank is free and its inputs exist:
- F(s, j) needs F(s-1, j) (plus one p2p transfer when s-1 runs on another rank);
- B(s, j) / I(s, j) needs the gradient from B/I(s+1, j) (plus a transfer), or, on the last stage,
  F(s, j) — the loss is part of the last forward;
- W(s, j) needs I(s, j).
Ranks are advanced round-robin until every action is placed; an order that can never finish is a
:class:`ScheduleError`. Each action lasts its stage's cost plus ``action_overhead_ns`` (the
schedule's own per-action cost: posting p2p ops, Python). Activations: +1 chunk at each F, -1 when
the micro-batch's backward for that stage completes (B, or W for split backwards, which still
needs the layer inputs). Bubble fraction = mean over ranks of idle / makespan — the same figure the
measured step bubble reports, and the closed forms of ``schedules.py`` for equal stage times.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bubblescope.analysis.schedule_orders import BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, FORWARD, Action
from bubblescope.analysis.schedules import ScheduleError, lookup

#: The share of a backward that computes weight gradients, where a run did not measure it.
DEFAULT_WEIGHT_SHARE = 0.5


@dataclass(frozen=True)
class StageCost:
    """One (virtual) stage's time per micro-batch, ns. ``weight_ns`` is the W part of ``backward_ns``."""

    forward_ns: float
    backward_ns: float
    weight_ns: float | None = None

    def duration(self, kind: str) -> float:
        weight = self.weight_ns if self.weight_ns is not None else DEFAULT_WEIGHT_SHARE * self.backward_ns
        if kind == FORWARD:
            return self.forward_ns
        if kind == BACKWARD:
            return self.backward_ns
        if kind == BACKWARD_WEIGHT:
            return weight
        return self.backward_ns - weight


@dataclass(frozen=True)
class PipelineSetup:
    """What to replay: schedule, shape, per-stage costs and the communication model."""

    schedule: str
    ranks: int
    microbatches: int
    stage_costs: tuple[StageCost, ...]  # one per virtual stage, in stage order
    stages_per_rank: int = 1
    p2p_ns: float = 0.0
    action_overhead_ns: float = 0.0
    step_overhead_ns: float = 0.0  # outside the pipeline: data loading, optimizer, grad all-reduce

    @property
    def num_stages(self) -> int:
        return self.ranks * self.stages_per_rank


@dataclass(frozen=True)
class TimedAction:
    rank: int
    action: Action
    start_ns: float
    end_ns: float


@dataclass(frozen=True)
class SimulationResult:
    schedule: str
    step_ns: float  # makespan + step overhead
    makespan_ns: float
    busy_ns: tuple[float, ...]
    idle_ns: tuple[float, ...]
    bubble_fraction: float
    peak_activations: tuple[int, ...]  # chunks in flight, per rank
    timeline: tuple[TimedAction, ...] = field(repr=False)


def simulate(setup: PipelineSetup) -> SimulationResult:
    schedule = lookup(setup.schedule)
    name = schedule.name
    v = 1 if schedule.placement == "single" else setup.stages_per_rank
    if len(setup.stage_costs) != setup.ranks * v:
        raise ScheduleError(
            "stage_costs",
            f"{name} on {setup.ranks} ranks × {v} stages per rank needs "
            f"{setup.ranks * v} stage costs, got {len(setup.stage_costs)}",
        )
    orders = schedule.build_orders(setup.ranks, setup.microbatches, v)
    last_stage = setup.ranks * v - 1
    done: dict[tuple[str, int, int], float] = {}
    grad_done: dict[tuple[int, int], float] = {}
    free = [0.0] * setup.ranks
    busy = [0.0] * setup.ranks
    pointer = [0] * setup.ranks
    in_flight = [0] * setup.ranks
    peak = [0] * setup.ranks
    timeline: list[TimedAction] = []

    def ready_at(rank: int, action: Action) -> float | None:
        s, j = action.stage, action.microbatch
        if action.kind == FORWARD:
            if s == 0:
                return 0.0
            return _arrival(done.get((FORWARD, s - 1, j)), rank, schedule.stage_rank(setup.ranks, s - 1), setup.p2p_ns)
        if action.kind == BACKWARD_WEIGHT:
            return done.get((BACKWARD_INPUT, s, j))
        if s == last_stage:
            return done.get((FORWARD, s, j))
        return _arrival(grad_done.get((s + 1, j)), rank, schedule.stage_rank(setup.ranks, s + 1), setup.p2p_ns)

    remaining = sum(len(order) for order in orders.values())
    while remaining:
        progressed = False
        for rank, order in orders.items():
            while pointer[rank] < len(order):
                action = order[pointer[rank]]
                ready = ready_at(rank, action)
                if ready is None:
                    break
                start = max(free[rank], ready)
                length = setup.stage_costs[action.stage].duration(action.kind) + setup.action_overhead_ns
                end = start + length
                free[rank] = end
                busy[rank] += length
                done[(action.kind, action.stage, action.microbatch)] = end
                if action.kind in (BACKWARD, BACKWARD_INPUT):
                    grad_done[(action.stage, action.microbatch)] = end
                in_flight[rank] += _activation_change(action.kind)
                peak[rank] = max(peak[rank], in_flight[rank])
                timeline.append(TimedAction(rank, action, start, end))
                pointer[rank] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {r: order[pointer[r]] for r, order in orders.items() if pointer[r] < len(order)}
            raise ScheduleError("schedule", f"{name} cannot finish; ranks wait forever on {stuck}")
    makespan = max(free)
    idle = tuple(makespan - b for b in busy)
    return SimulationResult(
        schedule=name,
        step_ns=makespan + setup.step_overhead_ns,
        makespan_ns=makespan,
        busy_ns=tuple(busy),
        idle_ns=idle,
        bubble_fraction=sum(idle) / (makespan * setup.ranks) if makespan else 0.0,
        peak_activations=tuple(peak),
        timeline=tuple(timeline),
    )


def _arrival(produced: float | None, rank: int, producer_rank: int, p2p_ns: float) -> float | None:
    if produced is None:
        return None
    return produced if producer_rank == rank else produced + p2p_ns


def _activation_change(kind: str) -> int:
    if kind == FORWARD:
        return 1
    if kind in (BACKWARD, BACKWARD_WEIGHT):
        return -1
    return 0


def uniform_costs(
    stages: int, forward_ns: float, backward_ns: float, weight_ns: float | None = None
) -> tuple[StageCost, ...]:
    return tuple(StageCost(forward_ns, backward_ns, weight_ns) for _ in range(stages))
