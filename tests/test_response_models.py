"""The API's response models are its own, filled from the analysis dataclasses: each must carry every
field of the result it is filled from (a field left out would silently vanish from the API)."""

from __future__ import annotations

from dataclasses import fields

import pytest
from pydantic import BaseModel

from bubblescope.analysis import attribution, model, pipeline_profile, run_report, simulator, stragglers, suggestions
from bubblescope.backend.analysis import schemas as analysis_api
from bubblescope.backend.runs import schemas as runs_api
from bubblescope.backend.stragglers import schemas as stragglers_api

FILLED_FROM = [
    (model.RankBreakdown, runs_api.RankBreakdownOut),
    (model.StepBubble, runs_api.StepBubbleOut),
    (simulator.StageCost, analysis_api.StageCostOut),
    (simulator.PipelineSetup, analysis_api.PipelineSetupOut),
    (pipeline_profile.MeasuredPipeline, analysis_api.MeasuredPipelineOut),
    (attribution.Cause, analysis_api.CauseOut),
    (attribution.BubbleAttribution, analysis_api.BubbleAttributionOut),
    (attribution.LayerMove, analysis_api.LayerMoveOut),
    (attribution.StageImbalance, analysis_api.StageImbalanceOut),
    (suggestions.Suggestion, analysis_api.SuggestionOut),
    (run_report.StageBreakdown, analysis_api.StageBreakdownOut),
    (run_report.RunReport, analysis_api.AnalysisOut),
    (stragglers.PhaseMatrix, stragglers_api.PhaseMatrixOut),
    (stragglers.RankScore, stragglers_api.RankScoreOut),
    (stragglers.GroupFinding, stragglers_api.GroupFindingOut),
    (stragglers.Finding, stragglers_api.FindingOut),
    (stragglers.StragglerThresholds, stragglers_api.StragglerThresholdsOut),
    (stragglers.StragglerReport, stragglers_api.StragglersOut),
]


@pytest.mark.parametrize("result,response", FILLED_FROM, ids=[result.__name__ for result, _ in FILLED_FROM])
def test_a_response_model_carries_every_field_of_its_result(result: type, response: type[BaseModel]) -> None:
    missing = sorted({item.name for item in fields(result)} - set(response.model_fields))
    assert missing == [], f"{response.__name__} drops {missing} of {result.__name__}"
