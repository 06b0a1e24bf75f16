"""A run's analysis over a step range, and what-if replays: the report ``derived.report`` makes, in the
API's shapes."""

from __future__ import annotations

from sqlalchemy.orm import Session

from bubblescope import analysis
from bubblescope.backend.analysis.schemas import (
    AnalysisOut,
    BlockCostOut,
    BubbleAttributionOut,
    MeasuredPipelineOut,
    PredictionOut,
    StageBreakdownOut,
    StageImbalanceOut,
    StageMemoryOut,
    StepSplitOut,
    SuggestionOut,
    WhatIfIn,
)
from bubblescope.backend.derived.report import run_report, run_what_if
from bubblescope.backend.store.runs import require_run


def run_analysis(session: Session, key: str, from_step: int | None, to_step: int | None) -> AnalysisOut:
    return analysis_out(key, run_report(session, require_run(session, key), from_step, to_step))


def analysis_out(key: str, report: analysis.RunReport) -> AnalysisOut:
    """The report of run ``key`` as the API answers it."""
    return AnalysisOut(
        run_key=key,
        steps=report.steps,
        partial_steps_left_out=report.partial_steps_left_out,
        warmup_steps_left_out=report.warmup_steps_left_out,
        steps_from_aggregates=report.steps_from_aggregates,
        step_ns=report.step_ns,
        step_bubble_fractions=report.step_bubble_fractions,
        stages=[StageBreakdownOut.model_validate(stage) for stage in report.stages],
        memory=[StageMemoryOut.model_validate(row) for row in report.memory],
        exposed_comm_ns_by_group=report.exposed_comm_ns_by_group,
        pipeline=None if report.pipeline is None else MeasuredPipelineOut.model_validate(report.pipeline),
        pipeline_unavailable=report.pipeline_unavailable,
        attribution=None if report.attribution is None else BubbleAttributionOut.model_validate(report.attribution),
        imbalance=None if report.imbalance is None else StageImbalanceOut.model_validate(report.imbalance),
        layers_source=report.layers_source,
        params_per_stage=report.params_per_stage,
        suggestions=[SuggestionOut.model_validate(s) for s in report.suggestions],
        step_split=None if report.step_split is None else StepSplitOut.model_validate(report.step_split),
        block_costs=[BlockCostOut.model_validate(cost) for cost in report.block_costs],
        advice_withheld=report.advice_withheld,
    )


def what_if(session: Session, key: str, body: WhatIfIn) -> PredictionOut:
    change = analysis.Change(
        schedule=body.schedule,
        microbatches=body.microbatches,
        microbatch_scale=body.microbatch_scale,
        stages_per_rank=body.stages_per_rank,
        layers_per_stage=tuple(body.layers_per_stage) if body.layers_per_stage else None,
        slowest_rank_to_median=body.slowest_rank_to_median,
        overlap_communication=body.overlap_communication,
    )
    # an InputError names the body field it is about
    answer = run_what_if(session, require_run(session, key), change, body.from_step, body.to_step)
    prediction = answer.prediction
    return PredictionOut(
        measured_step_ns=answer.measured_step_ns,
        schedule=prediction.schedule,
        microbatches=prediction.microbatches,
        stages_per_rank=prediction.stages_per_rank,
        layers_per_stage=list(prediction.layers_per_stage) if prediction.layers_per_stage else None,
        step_ns=prediction.step_ns,
        bubble_fraction=prediction.bubble_fraction,
        peak_activations=prediction.peak_activations,
        idle_ns_per_rank=list(prediction.result.idle_ns),
        samples_per_step_ratio=answer.samples_per_step_ratio,
        global_batch_held=answer.global_batch_held,
    )
