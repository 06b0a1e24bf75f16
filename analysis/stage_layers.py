"""What each layer of a pipeline stage costs, and what each stage computes outside its layers.

The pipelining integration times each layer of a stage on detailed steps (spans named
``wire.stage_layer_span_name``, nested in the stage's actions). From them:

1. A layer's cost per micro-batch: per step that timed it, its forward spans summed (every micro-batch's call,
   and the pieces a blocking wait cut a span into) over the micro-batches; the median over those steps; the
   same for its backward. A stage's layers in the order they first ran forward.
2. A stage's own work: its action cost over the same steps (``pipeline_profile``'s median forward, backward of
   the steps that timed the layers) less the sum of its layers' costs, each part at least 0. It is what the
   stage computes outside its layers: the runtime's per-action cost, an embedding, a final norm and head, the
   loss (folded into the last stage's forward), the first stage not computing its input's gradient.
3. When layers move, a stage costs its own work plus its new layers'. The first stage keeps the first's own
   work (an embedding, no input gradient), the last the last's (head, loss), and every stage between the
   cheapest stage's own work (what every action pays; the middle stages' own work differs by noise only).
   One value for the middle stages, and none above the first's, keeps the balanced split exact
   (``whatif.balanced_split`` needs a stage's best cost never to fall as it takes more layers).

Used only when every stage's layers were timed, as many as the run's layer counts say, with a full
backward (a zero-bubble schedule's split backward is not timed by layer): otherwise the stage costs are
spread evenly over their layers (``MeasuredPipeline.layer_costs``).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from bubblescope import wire
from bubblescope.analysis.model import TimedSpan
from bubblescope.analysis.simulator import StageCost


@dataclass
class LayerTimes:
    """One stage layer's spans in the steps read: per step, its forward and its backward summed (the pieces a
    wait cut a span into, and every micro-batch's call), and where it first ran forward (step, start)."""

    forward: dict[int, int] = field(default_factory=dict)
    backward: dict[int, int] = field(default_factory=dict)
    first: tuple[int, int] | None = None


LayerDurations = dict[tuple[int, str], LayerTimes]
"""(stage, layer name) -> its times."""


@dataclass(frozen=True)
class StageLayers:
    layers: tuple[tuple[StageCost, ...], ...]
    """Per stage, each layer's forward and backward per micro-batch, in the stage's layer order."""
    own: tuple[StageCost, ...]
    """Per stage, its action's cost less its layers' (algorithm, 2)."""

    @property
    def flat(self) -> tuple[StageCost, ...]:
        """Every layer's cost, stage after stage."""
        return tuple(cost for stage in self.layers for cost in stage)

    def own_work(self, stage: int, stages: int) -> StageCost:
        """Stage ``stage``'s own work when the layers are cut into ``stages`` stages (algorithm, 3)."""
        own = self.own
        if stage == 0:
            return own[0]
        if stage == stages - 1:
            return own[-1]
        return min(own, key=lambda c: c.forward_ns + c.backward_ns)

    def own_totals(self, stages: int) -> list[float]:
        """Forward + backward of each stage's own work when cut into ``stages`` stages."""
        works = [self.own_work(s, stages) for s in range(stages)]
        return [work.forward_ns + work.backward_ns for work in works]


def add_layer_spans(step: int, spans: Iterable[TimedSpan], into: LayerDurations) -> bool:
    """Each stage layer span of ``step`` under its (stage, layer); whether the step had any."""
    found_any = False
    for span in spans:
        if span.stage is not None or span.kind not in ("forward", "backward"):
            continue
        found = wire.stage_layer_of(span.name)
        if found is None:
            continue
        found_any = True
        times = into.setdefault(found, LayerTimes())
        summed = times.forward if span.kind == "forward" else times.backward
        summed[step] = summed.get(step, 0) + span.end_ns - span.start_ns
        if span.kind == "forward" and (times.first is None or (step, span.start_ns) < times.first):
            times.first = (step, span.start_ns)
    return found_any


def stage_layers(
    durations: LayerDurations,
    stage_costs: Sequence[StageCost],
    layers_per_stage: Sequence[int] | None,
    microbatches: int,
) -> StageLayers | None:
    """The stages' layers and own work (algorithm), or None where they cannot be used. ``stage_costs``: the
    stages' action costs over the same steps as the layers' (the steps that timed them)."""
    if not durations or len(stage_costs) == 0 or any(cost.weight_ns is not None for cost in stage_costs):
        return None
    by_stage: dict[int, list[tuple[tuple[int, int], str]]] = defaultdict(list)
    for (stage, layer), times in durations.items():
        if times.first is None or not times.backward:
            return None
        by_stage[stage].append((times.first, layer))
    if set(by_stage) != set(range(len(stage_costs))):
        return None
    per_stage: list[tuple[StageCost, ...]] = []
    own: list[StageCost] = []
    for stage, cost in enumerate(stage_costs):
        names = [layer for _, layer in sorted(by_stage[stage])]  # the order they run forward
        if layers_per_stage is not None and len(names) != layers_per_stage[stage]:
            return None
        timed = []
        for name in names:
            times = durations[(stage, name)]
            timed.append(
                StageCost(
                    statistics.median(times.forward.values()) / microbatches,
                    statistics.median(times.backward.values()) / microbatches,
                )
            )
        per_stage.append(tuple(timed))
        own.append(
            StageCost(
                max(0.0, cost.forward_ns - sum(c.forward_ns for c in timed)),
                max(0.0, cost.backward_ns - sum(c.backward_ns for c in timed)),
            )
        )
    return StageLayers(tuple(per_stage), tuple(own))
