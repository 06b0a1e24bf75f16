"""A run's whole report over a window of its steps: the breakdown per stage, the measured pipeline and its
replay, the bubble's causes, stage imbalance, memory per stage, and the ranked suggestions; and what-if
replays of the same steps. The wiring of the analysis modules, over plain data (``RunFacts`` and
``BrokenDownStep``s); a source reads the steps ``choose_steps`` names and hands them over.

The window: of the steps with spans in the range asked for, the complete ones past the warm-up
(``warmup.usual_steps``), the newest ``MAX_ANALYSED_STEPS`` of them; the partial and warm-up steps left
out are listed.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from bubblescope import intervals, wire
from bubblescope.analysis.attribution import BubbleAttribution, StageImbalance, attribute_bubble, stage_imbalance
from bubblescope.analysis.block_costs import BlockCost, block_costs
from bubblescope.analysis.breakdown import stage_wait_shares
from bubblescope.analysis.errors import InputError
from bubblescope.analysis.gain_noise import with_noise
from bubblescope.analysis.layout_fixes import trade_dp_for_pp
from bubblescope.analysis.memory_fixes import memory_suggestions, predicted_memory_per_pipeline_rank
from bubblescope.analysis.memory_use import RankMemory, StageMemory, stage_memory
from bubblescope.analysis.model import RankBreakdown, RankPlace, TimedSpan
from bubblescope.analysis.pipeline_profile import MeasuredPipeline, StepSpans, measure_pipeline
from bubblescope.analysis.spread import range95
from bubblescope.analysis.step_fixes import step_fixes
from bubblescope.analysis.step_record import BrokenDownStep, bubble_of_step
from bubblescope.analysis.step_split import Culprit, StepSplit, split_steps
from bubblescope.analysis.stragglers import MIN_VERDICT_STEPS, StragglerReport
from bubblescope.analysis.suggestions import RunEvidence, StragglerNote, Suggestion, suggest
from bubblescope.analysis.warmup import WARMUP_STEPS, StepSeen, is_complete, is_warmup, usual_steps
from bubblescope.analysis.whatif import Change, Prediction, predict

MAX_ANALYSED_STEPS: Final = 50
"""The newest steps with spans in the range that are analysed: enough for stable medians."""


@dataclass(frozen=True)
class RunFacts:
    """What the analysis knows of a run besides its steps: its size, its config (the keys the run
    registered), where each rank runs, and the (layers, parameters) its ranks counted in each stage."""

    world_size: int
    config: Mapping[str, Any]
    places: Sequence[RankPlace]
    stage_sizes: Mapping[int, tuple[int, int | None]] = field(default_factory=dict)


@dataclass(frozen=True)
class StepWindow:
    """The steps to analyse (oldest first), those of them read from their aggregates (no spans), and the
    steps with spans in the range left out."""

    steps: list[int]
    partial_left_out: list[int]
    warmup_left_out: list[int]
    from_aggregates: list[int] = field(default_factory=list)


MIN_SPANNED_STEPS: Final = 10
"""Fewer steps with spans than this past the warm-up (a short run, full spans every N-th step): the window
takes every complete step past the warm-up, from its aggregates where it has no spans."""


def choose_steps(
    seen: Sequence[StepSeen],
    world_size: int,
    from_step: int | None = None,
    to_step: int | None = None,
    warmup_steps: int = WARMUP_STEPS,
) -> StepWindow:
    """The window of ``seen`` in [from_step, to_step] (module docstring); the warm-up is left out unless
    ``from_step`` is given. ``steps`` is empty when no step with spans is in the range."""
    in_range = [
        s for s in seen if (from_step is None or s.step >= from_step) and (to_step is None or s.step <= to_step)
    ]
    usual = usual_steps(in_range, world_size, skip_warmup=from_step is None, warmup_steps=warmup_steps)
    chosen = {s.step for s in usual}
    left_out = [s for s in in_range if s.has_spans and s.step not in chosen]
    partial = [s.step for s in left_out if not is_complete(s, world_size)]
    aggregated: set[int] = set()
    if usual and len(usual) < MIN_SPANNED_STEPS:
        first = min(s.step for s in seen)
        aggregated = {
            s.step
            for s in in_range
            if not s.has_spans
            and is_complete(s, world_size)
            and (from_step is not None or not is_warmup(s.step, first, warmup_steps))
        }
    steps = sorted(chosen | aggregated)[-MAX_ANALYSED_STEPS:]
    return StepWindow(
        steps=steps,
        partial_left_out=partial,
        warmup_left_out=[s.step for s in left_out if s.step not in partial],
        from_aggregates=[step for step in steps if step in aggregated],
    )


def straggler_range(window: StepWindow) -> tuple[int, int] | None:
    """The step range whose straggler report the suggestions read: the analysed steps' span, once it holds
    ``MIN_VERDICT_STEPS`` steps (so without the warm-up and a crashed run's partial step); None: too short."""
    steps = window.steps
    if not steps or steps[-1] - steps[0] + 1 < MIN_VERDICT_STEPS:
        return None
    return steps[0], steps[-1]


@dataclass(frozen=True)
class StageBreakdown:
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


MIN_ADVICE_STEPS: Final = 3
"""Steps a report needs before it prices a fix: on one or two (a crashed run's, a run just started) a single slow
step would be the whole evidence."""


@dataclass(frozen=True)
class RunReport:
    """The whole analysis of a window of a run's steps (``backend`` answers it as ``AnalysisOut``)."""

    steps: list[int]
    steps_from_aggregates: list[int]  # of ``steps``, those without spans: read from their aggregates
    partial_steps_left_out: list[int]
    warmup_steps_left_out: list[int]
    step_ns: float  # median step wall time over the steps
    step_bubble_fractions: list[float]  # each step's measured bubble over its wall time
    stages: list[StageBreakdown]
    memory: list[StageMemory]
    exposed_comm_ns_by_group: dict[str, float]  # mean per rank per step, pipeline p2p excluded
    pipeline: MeasuredPipeline | None
    pipeline_unavailable: str | None  # why there is no pipeline replay
    attribution: BubbleAttribution | None
    imbalance: StageImbalance | None
    layers_source: str | None  # "declared" (config), "counted" (the ranks), None (unknown)
    params_per_stage: list[int] | None
    suggestions: list[Suggestion]
    step_split: StepSplit | None = None  # a job without a pipeline: where its step goes (no bubble)
    advice_withheld: str | None = None  # why ``suggestions`` is empty though fixes were found: too few steps
    block_costs: list[BlockCost] = field(default_factory=list)  # per instrumented block (``blocks=``)


@dataclass(frozen=True)
class _StepFigures:
    """What the report reads of each analysed step, measured once."""

    spans: list[StepSpans]
    bubble_ns: list[float]
    walls: list[int]
    exposed_by_group: dict[str, float]
    mesh_waits_ns: list[float]  # per step with collectives over dp/tp/...: their waits, mean per rank


def analyse_run(
    facts: RunFacts,
    window: StepWindow,
    steps: Sequence[BrokenDownStep],
    memory: Sequence[RankMemory] = (),
    stragglers: StragglerReport | None = None,
) -> RunReport:
    """The report over ``steps`` (the window's, read by the caller, in its order). ``memory``: each rank's
    peaks over those steps; ``stragglers``: the report over ``straggler_range(window)``, when there is one."""
    if not steps:
        raise InputError("from_step", "no step with spans in the range")
    steps = with_run_wait_shares(steps)
    figures = _step_figures(facts, [s for s in steps if s.record.spans] or list(steps))
    step_ns = float(statistics.median(figures.walls))
    config, layers_source, params_per_stage = _with_counted_layers(facts)
    has_pipeline = describes_pipeline(facts.config)
    measured, why_not = _measure(config, [s for s in figures.spans if s.spans]) if has_pipeline else (None, None)
    stage_memory_rows = _memory(facts, memory)
    attribution = imbalance = None
    if measured is not None:
        mesh_wait = statistics.median(figures.mesh_waits_ns) if figures.mesh_waits_ns else None
        attribution = attribute_bubble(measured, statistics.median(figures.bubble_ns), step_ns, mesh_wait)
        imbalance = stage_imbalance(measured)
    nearest_limit = next((m for m in stage_memory_rows if m.nearest_limit), None)
    split = None if has_pipeline else split_steps(steps, facts.places)
    evidence = RunEvidence(
        config=facts.config,
        step_ns=step_ns,
        measured=measured,
        attribution=attribution,
        imbalance=imbalance,
        exposed_comm_ns=figures.exposed_by_group,
        tp_hosts_per_group=_tp_hosts(facts.places),
        memory_notes=memory_suggestions(facts.config, step_ns, nearest_limit),
        stragglers=straggler_notes(stragglers, split.culprit if split is not None else None),
    )
    evidence = replace(evidence, layout_notes=trade_dp_for_pp(evidence, mesh_sizes(facts.places)))
    fixes = suggest(evidence) if split is None else _job_fixes(split, evidence)
    replay_error_ns = attribution.replay_excess_ns if attribution is not None else 0.0
    withheld = (
        f"{len(steps)} step{'s' if len(steps) != 1 else ''} analysed: a fix is priced on at least {MIN_ADVICE_STEPS}"
        if len(steps) < MIN_ADVICE_STEPS
        else None
    )
    return RunReport(
        steps=[s.record.step for s in steps],
        steps_from_aggregates=window.from_aggregates,
        partial_steps_left_out=window.partial_left_out,
        warmup_steps_left_out=window.warmup_left_out,
        step_ns=step_ns,
        step_bubble_fractions=[ns / wall if wall else 0.0 for ns, wall in zip(figures.bubble_ns, figures.walls)],
        stages=_per_stage([s.breakdowns for s in steps]),
        memory=stage_memory_rows,
        exposed_comm_ns_by_group=figures.exposed_by_group,
        pipeline=measured,
        pipeline_unavailable=why_not,
        attribution=attribution,
        imbalance=imbalance,
        layers_source=layers_source if measured is not None and measured.layers_per_stage else None,
        params_per_stage=params_per_stage,
        suggestions=[] if withheld else with_noise(fixes, range95(figures.walls) + replay_error_ns),
        step_split=split,
        advice_withheld=withheld,
        block_costs=block_costs([s.record.spans for s in steps if s.record.spans]),
    )


def with_run_wait_shares(steps: Sequence[BrokenDownStep]) -> list[BrokenDownStep]:
    """``steps``, those without any spans (read from their aggregates) with each rank's exposed communication
    split into waiting and transfer as its stage's ranks' was in the steps with spans (each stage's median
    share, ``stage_wait_shares``): a step alone has no spans to split it by."""
    spanned = [b for step in steps if step.record.spans for b in step.breakdowns if b.from_spans]
    if not spanned or all(step.record.spans for step in steps):
        return list(steps)
    shares = stage_wait_shares(spanned)
    out = []
    for step in steps:
        if step.record.spans:
            out.append(step)
            continue
        rows = []
        for b in step.breakdowns:
            wait = round(b.exposed_comm_ns * shares.get(b.stage, 0.0))
            bubble = b.idle_ns + wait
            rows.append(
                replace(
                    b,
                    dependency_wait_ns=wait,
                    transfer_ns=b.exposed_comm_ns - wait,
                    bubble_ns=bubble,
                    bubble_fraction=bubble / b.window_ns if b.window_ns else 0.0,
                )
            )
        out.append(replace(step, breakdowns=rows))
    return out


def describes_pipeline(config: Mapping[str, Any]) -> bool:
    """Whether the run registered a pipeline (a schedule: ``collector.instrument``, ``describe_pipeline``)."""
    return bool(config.get("schedule"))


def _job_fixes(split: StepSplit, evidence: RunEvidence) -> list[Suggestion]:
    """A job without a pipeline: its step's fixes, with the run-wide ones (TP placement, a straggler to drain,
    memory) that do not repeat them."""
    own = step_fixes(split, evidence)
    kinds = {s.kind for s in own}
    drained = {s.apply.get("exclude_hosts", [None])[0] for s in own if s.kind == "late_rank"}
    others = [
        s
        for s in suggest(evidence)
        if s.kind not in kinds
        and not (s.kind == "drain_straggler" and s.apply.get("exclude_hosts", [None])[0] in drained)
    ]
    return sorted([*own, *others], key=lambda s: s.gain_fraction, reverse=True)


class NotReplayable(InputError):
    """The run's steps do not describe a pipeline the replay knows (``message`` says why)."""

    def __init__(self, why: str) -> None:
        super().__init__("run_key", why)


@dataclass(frozen=True)
class WhatIf:
    """A replay of the measured run with one thing changed, beside the measured step."""

    measured_step_ns: float
    prediction: Prediction
    samples_per_step_ratio: float  # samples a step processes after the change over today's
    global_batch_held: bool


def what_if(facts: RunFacts, steps: Sequence[BrokenDownStep], change: Change) -> WhatIf:
    """``change`` replayed over the measured pipeline of ``steps``; ``NotReplayable`` when the steps hold
    none, an ``InputError`` naming the change's field when the change does not fit it."""
    config, _, _ = _with_counted_layers(facts)
    measured, why_not = _measure(config, [_step_spans(step) for step in steps if step.record.spans])
    if measured is None:
        raise NotReplayable(why_not or "no pipeline")
    prediction = predict(measured, change)
    ratio = prediction.microbatches * change.microbatch_scale / measured.setup.microbatches
    return WhatIf(measured.measured_step_ns, prediction, ratio, abs(ratio - 1) < 1e-6)


def straggler_notes(report: StragglerReport | None, culprit: Culprit | None = None) -> list[StragglerNote]:
    """The persistent slow ranks and hosts of a straggler report, as the suggestions take them; none whose ranks
    wait in the collectives for ``culprit``, the rank a job without a pipeline waits for (draining them would
    leave the step as long)."""
    if report is None:
        return []
    hosts = {score.rank: score.host for score in report.rank_scores}
    return [
        StragglerNote(finding.ranks[0], hosts.get(finding.ranks[0]), finding.ratio or 1.0, finding.message)
        for finding in report.findings
        if finding.verdict == "persistent"
        and finding.kind in ("slow rank", "slow host")
        and finding.ranks
        and not (culprit is not None and culprit.waited_on_by(finding.ranks))
    ]


def mesh_sizes(places: Sequence[RankPlace]) -> dict[str, int]:
    """Each mesh dimension's size: its largest coordinate plus one."""
    sizes: dict[str, int] = {}
    for place in places:
        for name, value in place.coords.items():
            sizes[name] = max(sizes.get(name, 0), value + 1)
    return sizes


def _step_figures(facts: RunFacts, steps: Sequence[BrokenDownStep]) -> _StepFigures:
    figures = _StepFigures([], [], [], {}, [])
    exposed: dict[str, list[float]] = defaultdict(list)
    for step in steps:
        record = step.record
        bubble = bubble_of_step(facts.config, step)
        figures.spans.append(_step_spans(step))
        span_windows = figures.spans[-1].windows  # a big run's sampled replicas (analysis/sampling.py)
        figures.bubble_ns.append(bubble.measured_fraction * bubble.wall_ns)
        figures.walls.append(bubble.wall_ns)
        for group, ns in _exposed_comm_by_group(record.spans, len(span_windows)).items():
            exposed[group].append(ns)
        if step.mesh_wait_ns is not None:
            figures.mesh_waits_ns.append(step.mesh_wait_ns)
    figures.exposed_by_group.update({g: sum(v) / len(steps) for g, v in exposed.items()})
    return figures


def _step_spans(step: BrokenDownStep) -> StepSpans:
    """The step as the pipeline's measurement reads it: the spans of the ranks whose spans were read."""
    record = step.record
    return StepSpans(record.step, record.spans, record.span_windows(), step.matched)


def _exposed_comm_by_group(spans: Sequence[TimedSpan], ranks: int) -> dict[str, float]:
    """Mean per rank of each group's communication not under compute (pipeline p2p excluded)."""
    compute: dict[int, list[intervals.Interval]] = defaultdict(list)
    comm: dict[tuple[int, str], list[intervals.Interval]] = defaultdict(list)
    for span in spans:
        if span.kind in wire.COMPUTE_KINDS:
            compute[span.rank].append((span.start_ns, span.end_ns))
        elif span.group and span.name not in (wire.P2P_FORWARD, wire.P2P_BACKWARD):
            comm[(span.rank, span.group)].append((span.start_ns, span.end_ns))
    totals: dict[str, float] = defaultdict(float)
    merged_compute = {rank: intervals.merge(c) for rank, c in compute.items()}
    for (rank, group), parts in comm.items():
        merged = intervals.merge(parts)
        totals[group] += intervals.total_length(merged) - intervals.intersect_length(
            merged, merged_compute.get(rank, [])
        )
    return {group: total / max(1, ranks) for group, total in totals.items()}


def _measure(config: Mapping[str, Any], spans: Sequence[StepSpans]) -> tuple[MeasuredPipeline | None, str | None]:
    try:
        return measure_pipeline(spans, config), None
    except InputError as error:
        return None, str(error)


def _with_counted_layers(facts: RunFacts) -> tuple[dict[str, Any], str | None, list[int] | None]:
    """The run's config with ``layers_per_stage`` from the ranks' counts where the job declared none
    (when every stage was counted), where the layers come from, and the parameters per stage counted."""
    config = dict(facts.config)
    sizes = facts.stage_sizes
    complete = bool(sizes) and sorted(sizes) == list(range(len(sizes)))
    params = [sizes[s][1] for s in range(len(sizes))] if complete else None
    params_per_stage = None if params is None or None in params else [p for p in params if p is not None]
    if config.get("layers_per_stage") is not None:
        return config, "declared", params_per_stage
    if not complete:
        return config, None, params_per_stage
    config["layers_per_stage"] = [sizes[stage][0] for stage in range(len(sizes))]
    return config, "counted", params_per_stage


def _per_stage(breakdowns: Sequence[Sequence[RankBreakdown]]) -> list[StageBreakdown]:
    by_stage: dict[int | None, list[RankBreakdown]] = defaultdict(list)
    for step in breakdowns:
        for b in step:
            by_stage[b.stage].append(b)
    out = []
    for stage, rows in sorted(by_stage.items(), key=lambda item: (item[0] is None, item[0] or 0)):
        n = len(rows)
        out.append(
            StageBreakdown(
                stage=stage,
                ranks=sorted({b.rank for b in rows}),
                window_ns=sum(b.window_ns for b in rows) / n,
                compute_ns=sum(b.compute_ns for b in rows) / n,
                exposed_comm_ns=sum(b.exposed_comm_ns for b in rows) / n,
                overlapped_comm_ns=sum(b.overlapped_comm_ns for b in rows) / n,
                dependency_wait_ns=sum(b.dependency_wait_ns for b in rows) / n,
                transfer_ns=sum(b.transfer_ns for b in rows) / n,
                idle_ns=sum(b.idle_ns for b in rows) / n,
                bubble_fraction=sum(b.bubble_fraction for b in rows) / n,
            )
        )
    return out


def _memory(facts: RunFacts, per_rank: Sequence[RankMemory]) -> list[StageMemory]:
    """Measured memory per stage over the analysed steps, beside the planner's for a declared model."""
    if not per_rank:
        return []
    predicted = predicted_memory_per_pipeline_rank(facts.config)
    by_stage = None
    if predicted is not None:  # a rank registers its first stage: the pipeline ranks' order
        stages = sorted({r.stage for r in per_rank if r.stage is not None})
        by_stage = dict(zip(stages, predicted))
    return stage_memory(per_rank, by_stage)


def _tp_hosts(places: Sequence[RankPlace]) -> int:
    """The most hosts any tensor-parallel group spans (ranks equal in every mesh coordinate but tp)."""
    groups: dict[tuple[tuple[str, int], ...], set[str]] = defaultdict(set)
    for place in places:
        coords = place.coords
        if "tp" in coords:
            groups[tuple(sorted((k, v) for k, v in coords.items() if k != "tp"))].add(place.host)
    return max((len(hosts) for hosts in groups.values()), default=1)
