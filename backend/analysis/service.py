"""A run's analysis over a step range: attribution, stage imbalance, suggestions, what-if replays."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Row
from sqlalchemy.orm import Session

from bubblescope import intervals, wire
from bubblescope.analysis.attribution import attribute_bubble, stage_imbalance
from bubblescope.analysis.collective_waits import COLLECTIVE_KINDS, collective_waits
from bubblescope.analysis.errors import InputError
from bubblescope.analysis.layout_fixes import trade_dp_for_pp
from bubblescope.analysis.memory_fixes import memory_suggestions, predicted_memory_per_pipeline_rank
from bubblescope.analysis.memory_use import StageMemory, stage_memory
from bubblescope.analysis.model import RankBreakdown, TimedSpan
from bubblescope.analysis.pipeline_profile import MeasuredPipeline, StepSpans, measure_pipeline
from bubblescope.analysis.stragglers import MIN_VERDICT_STEPS
from bubblescope.analysis.suggestions import RunEvidence, StragglerNote, suggest
from bubblescope.analysis.warmup import is_complete, usual_steps
from bubblescope.analysis.whatif import Change, predict
from bubblescope.backend.analysis.schemas import (
    AnalysisOut,
    BubbleAttributionOut,
    MeasuredPipelineOut,
    PredictionOut,
    StageBreakdownOut,
    StageImbalanceOut,
    StageMemoryOut,
    SuggestionOut,
    WhatIfIn,
)
from bubblescope.backend.db.models import Run
from bubblescope.backend.errors import DomainError, Invalid, NotFound
from bubblescope.backend.fields import check_step_order
from bubblescope.backend.runs import queries
from bubblescope.backend.runs.queries import RankPlace
from bubblescope.backend.runs.service import require_run, run_bubble, steps_seen
from bubblescope.backend.runs.step_spans import broken_down_step, run_rank_places
from bubblescope.backend.stragglers.service import straggler_report

MAX_STEPS = 50  # the newest steps with spans in the range; enough for stable medians


@dataclass(frozen=True)
class _Window:
    steps: list[StepSpans]
    breakdowns: list[list[RankBreakdown]]
    bubble_ns: list[float]
    walls: list[int]
    exposed_by_group: dict[str, float]
    partial_left_out: list[int]
    warmup_left_out: list[int]
    mesh_waits_ns: list[float]  # per step, the mean per rank of waits inside dp/tp/... collectives


def run_analysis(session: Session, key: str, from_step: int | None, to_step: int | None) -> AnalysisOut:
    run = require_run(session, key)
    window = _load(session, run, from_step, to_step)
    step_ns = float(statistics.median(window.walls))
    sizes = _stage_sizes(session, run)
    measured, why_not = _measure(sizes.config, window)
    memory = _memory(session, run, window)
    attribution = imbalance = None
    if measured is not None:
        mesh_wait = statistics.median(window.mesh_waits_ns) if window.mesh_waits_ns else None
        attribution = attribute_bubble(measured, statistics.median(window.bubble_ns), step_ns, mesh_wait)
        imbalance = stage_imbalance(measured)
    places = run_rank_places(session, run)
    evidence = RunEvidence(
        config=run.config or {},
        step_ns=step_ns,
        measured=measured,
        attribution=attribution,
        imbalance=imbalance,
        exposed_comm_ns=window.exposed_by_group,
        tp_hosts_per_group=_tp_hosts(places),
        memory_notes=memory_suggestions(run.config or {}, step_ns, next((m for m in memory if m.nearest_limit), None)),
        stragglers=_straggler_notes(session, key, [s.step for s in window.steps]),
    )
    evidence = replace(evidence, layout_notes=trade_dp_for_pp(evidence, _mesh_sizes(places)))
    return AnalysisOut(
        run_key=key,
        steps=[s.step for s in window.steps],
        partial_steps_left_out=window.partial_left_out,
        warmup_steps_left_out=window.warmup_left_out,
        step_ns=step_ns,
        step_bubble_fractions=[ns / wall if wall else 0.0 for ns, wall in zip(window.bubble_ns, window.walls)],
        stages=_per_stage(window.breakdowns),
        memory=[StageMemoryOut.model_validate(row) for row in memory],
        exposed_comm_ns_by_group=window.exposed_by_group,
        pipeline=None if measured is None else MeasuredPipelineOut.model_validate(measured),
        pipeline_unavailable=why_not,
        attribution=None if attribution is None else BubbleAttributionOut.model_validate(attribution),
        imbalance=None if imbalance is None else StageImbalanceOut.model_validate(imbalance),
        layers_source=sizes.layers_source if measured is not None and measured.layers_per_stage else None,
        params_per_stage=sizes.params_per_stage,
        suggestions=[SuggestionOut.model_validate(s) for s in suggest(evidence)],
    )


def what_if(session: Session, key: str, body: WhatIfIn) -> PredictionOut:
    run = require_run(session, key)
    window = _load(session, run, body.from_step, body.to_step)
    measured, why_not = _measure(_stage_sizes(session, run).config, window)
    if measured is None:
        raise Invalid("run_key", f"run {key!r} cannot be replayed: {why_not}")
    change = Change(
        schedule=body.schedule,
        microbatches=body.microbatches,
        microbatch_scale=body.microbatch_scale,
        stages_per_rank=body.stages_per_rank,
        layers_per_stage=tuple(body.layers_per_stage) if body.layers_per_stage else None,
        slowest_rank_to_median=body.slowest_rank_to_median,
        overlap_communication=body.overlap_communication,
    )
    prediction = predict(measured, change)  # an InputError names the body field it is about
    samples_ratio = prediction.microbatches * body.microbatch_scale / measured.setup.microbatches
    return PredictionOut(
        measured_step_ns=measured.measured_step_ns,
        schedule=prediction.schedule,
        microbatches=prediction.microbatches,
        stages_per_rank=prediction.stages_per_rank,
        layers_per_stage=list(prediction.layers_per_stage) if prediction.layers_per_stage else None,
        step_ns=prediction.step_ns,
        bubble_fraction=prediction.bubble_fraction,
        peak_activations=prediction.peak_activations,
        idle_ns_per_rank=list(prediction.result.idle_ns),
        samples_per_step_ratio=samples_ratio,
        global_batch_held=abs(samples_ratio - 1) < 1e-6,
    )


def _load(session: Session, run: Run, from_step: int | None, to_step: int | None) -> _Window:
    check_step_order(from_step, to_step)
    seen = [
        s
        for s in steps_seen(queries.step_totals(session, run.id), queries.steps_with_spans(session, run.id))
        if (from_step is None or s.step >= from_step) and (to_step is None or s.step <= to_step)
    ]
    usual = usual_steps(seen, run.world_size, skip_warmup=from_step is None)
    candidates = [s.step for s in usual][-MAX_STEPS:]
    if not candidates:
        raise NotFound("from_step", f"run {run.key!r} has no step with spans in the range")
    chosen = {s.step for s in usual}
    left_out = [s for s in seen if s.has_spans and s.step not in chosen]
    partial = [s.step for s in left_out if not is_complete(s, run.world_size)]
    window = _Window([], [], [], [], {}, partial, [s.step for s in left_out if s.step not in partial], [])
    coords = {place.rank: place.coords for place in run_rank_places(session, run)}
    exposed: dict[str, list[float]] = defaultdict(list)
    for step in candidates:
        found = broken_down_step(session, run, step)
        assert found is not None
        aligned, breakdowns = found.aligned, found.breakdowns
        bubble = run_bubble(run, breakdowns, aligned.windows)
        span_windows = aligned.span_windows()  # a big run's sampled replicas (analysis/sampling.py)
        window.steps.append(StepSpans(step, aligned.spans, span_windows, found.matched))
        window.breakdowns.append(breakdowns)
        window.bubble_ns.append(bubble.measured_fraction * bubble.wall_ns)
        window.walls.append(bubble.wall_ns)
        for group, ns in _exposed_comm_by_group(aligned.rows, aligned.spans, len(span_windows)).items():
            exposed[group].append(ns)
        waited = _mesh_collective_waits(aligned.spans, coords, len(span_windows))
        if waited is not None:
            window.mesh_waits_ns.append(waited)
    steps = len(candidates)
    window.exposed_by_group.update({g: sum(v) / steps for g, v in exposed.items()})
    return window


def _mesh_collective_waits(spans: Sequence[TimedSpan], coords: dict[int, dict[str, int]], ranks: int) -> float | None:
    """Mean per rank of the waits for peers inside collectives over a mesh dimension other than the
    pipeline's (dp, tp, ...: outside what the replay models); None when the step has no such collective."""
    mesh = [
        s
        for s in spans
        if s.kind in COLLECTIVE_KINDS and s.group and s.group not in (wire.WORLD_GROUP, wire.PIPELINE_GROUP)
    ]
    if not mesh:
        return None
    waits = collective_waits(mesh, coords)
    return sum(intervals.total_length(intervals.merge(w)) for w in waits.values()) / max(1, ranks)


def _exposed_comm_by_group(rows: Sequence[Row[Any]], spans: Sequence[TimedSpan], ranks: int) -> dict[str, float]:
    """Mean per rank of each group's communication not under compute (pipeline p2p excluded)."""
    compute: dict[int, list[intervals.Interval]] = defaultdict(list)
    comm: dict[tuple[int, str], list[intervals.Interval]] = defaultdict(list)
    for row, span in zip(rows, spans):
        if span.kind in wire.COMPUTE_KINDS:
            compute[span.rank].append((span.start_ns, span.end_ns))
        elif row.group and span.name not in (wire.P2P_FORWARD, wire.P2P_BACKWARD):
            comm[(span.rank, row.group)].append((span.start_ns, span.end_ns))
    totals: dict[str, float] = defaultdict(float)
    merged_compute = {rank: intervals.merge(c) for rank, c in compute.items()}
    for (rank, group), parts in comm.items():
        merged = intervals.merge(parts)
        totals[group] += intervals.total_length(merged) - intervals.intersect_length(
            merged, merged_compute.get(rank, [])
        )
    return {group: total / max(1, ranks) for group, total in totals.items()}


def _measure(config: dict[str, Any], window: _Window) -> tuple[MeasuredPipeline | None, str | None]:
    try:
        return measure_pipeline(window.steps, config), None
    except InputError as error:
        return None, str(error)


@dataclass(frozen=True)
class _StageSizes:
    config: dict[str, Any]
    """The run's config, with ``layers_per_stage`` from the ranks' counts where the job declared none."""
    layers_source: str | None
    params_per_stage: list[int] | None


def _stage_sizes(session: Session, run: Run) -> _StageSizes:
    """The layers per stage the job declared, else those its ranks counted in their stage modules
    (when every stage was counted); and the parameters per stage they counted."""
    config = dict(run.config or {})
    sizes = queries.stage_sizes(session, run.id)
    complete = bool(sizes) and sorted(sizes) == list(range(len(sizes)))
    params = [sizes[s][1] for s in range(len(sizes))] if complete else None
    params_per_stage = None if params is None or None in params else [p for p in params if p is not None]
    if config.get("layers_per_stage") is not None:
        return _StageSizes(config, "declared", params_per_stage)
    if not complete:
        return _StageSizes(config, None, params_per_stage)
    config["layers_per_stage"] = [sizes[stage][0] for stage in range(len(sizes))]
    return _StageSizes(config, "counted", params_per_stage)


def _per_stage(breakdowns: list[list[RankBreakdown]]) -> list[StageBreakdownOut]:
    by_stage: dict[int | None, list[RankBreakdown]] = defaultdict(list)
    for step in breakdowns:
        for b in step:
            by_stage[b.stage].append(b)
    out = []
    for stage, rows in sorted(by_stage.items(), key=lambda item: (item[0] is None, item[0] or 0)):
        n = len(rows)
        out.append(
            StageBreakdownOut(
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


def _memory(session: Session, run: Run, window: _Window) -> list[StageMemory]:
    """Measured memory per stage over the analysed steps, beside the planner's for a declared model."""
    per_rank = queries.memory_peaks(session, run.id, [s.step for s in window.steps])
    if not per_rank:
        return []
    predicted = predicted_memory_per_pipeline_rank(run.config or {})
    by_stage = None
    if predicted is not None:  # a rank registers its first stage: the pipeline ranks' order
        stages = sorted({r.stage for r in per_rank if r.stage is not None})
        by_stage = dict(zip(stages, predicted))
    return stage_memory(per_rank, by_stage)


def _mesh_sizes(ranks: Sequence[RankPlace]) -> dict[str, int]:
    """Each mesh dimension's size: its largest coordinate plus one."""
    sizes: dict[str, int] = {}
    for info in ranks:
        for name, value in info.coords.items():
            sizes[name] = max(sizes.get(name, 0), value + 1)
    return sizes


def _tp_hosts(ranks: Sequence[RankPlace]) -> int:
    """The most hosts any tensor-parallel group spans (ranks equal in every mesh coordinate but tp)."""
    groups: dict[tuple[tuple[str, int], ...], set[str]] = defaultdict(set)
    for info in ranks:
        coords = info.coords
        if "tp" in coords:
            groups[tuple(sorted((k, v) for k, v in coords.items() if k != "tp"))].add(info.host)
    return max((len(hosts) for hosts in groups.values()), default=1)


def _straggler_notes(session: Session, key: str, steps: list[int]) -> list[StragglerNote]:
    """Persistent slow ranks and hosts, from the straggler analysis of the analysed steps' span (so
    without the warm-up and a crashed run's partial step), once it holds ``MIN_VERDICT_STEPS`` steps."""
    if not steps or steps[-1] - steps[0] + 1 < MIN_VERDICT_STEPS:
        return []
    try:
        _, report = straggler_report(session, key, steps[0], steps[-1])
    except DomainError:
        return []  # a range the straggler view refuses (too long): no straggler evidence
    hosts = {score.rank: score.host for score in report.rank_scores}
    return [
        StragglerNote(finding.ranks[0], hosts.get(finding.ranks[0]), finding.ratio or 1.0, finding.message)
        for finding in report.findings
        if finding.verdict == "persistent" and finding.kind in ("slow rank", "slow host") and finding.ranks
    ]
