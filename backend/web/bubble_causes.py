"""GET /api/v1/bubble-causes: every cause of a bubble the analysis names, and every part of a step without a
pipeline, with its label and colour, for the dashboard.

The one home of the causes' colours. The causes, their labels and what each stands for are the analysis'
(``analysis.CAUSE_KINDS``); a cause added there needs a colour here, which
``tests/dashboard/test_span_kinds.py`` checks."""

from __future__ import annotations

from typing import Final

from fastapi import APIRouter
from pydantic import BaseModel, Field

from bubblescope import analysis, wire

CAUSE_COLORS: Final[dict[str, str]] = {
    "schedule_inherent": "#9aa3b2",
    "stage_imbalance": "#f08c2e",
    "communication_wait": "#8e5bd0",
    "mesh_collective_wait": "#2a9d8f",
    "straggler_jitter": "#d0457a",
    # a step without a pipeline (analysis.STEP_PARTS)
    "model_compute": "#3b7dd8",
    "optimizer": "#6aa9e9",
    "data_loading": "#e0b13a",
    "collective_wait": "#17a2b8",
    "collective_transfer": "#b07cd8",
    "host_gaps": "#c8ccd4",
}


class BubbleCauseOut(BaseModel):
    name: str = Field(description="as an analysis' attribution.causes[].name carries it")
    label: str
    explanation: str
    color: str = Field(description="CSS colour the dashboard draws this cause with")


class BubbleCausesOut(BaseModel):
    causes: list[BubbleCauseOut] = Field(
        description="in the order an attribution lists them, then the parts of a step without a pipeline "
        "(analysis.step_split.parts) in the order a split lists them"
    )


router = APIRouter(prefix=wire.API_PREFIX, tags=["meta"])


@router.get("/bubble-causes", response_model=BubbleCausesOut, summary="Causes of a bubble with their label and colour")
def get_bubble_causes() -> BubbleCausesOut:
    return BubbleCausesOut(
        causes=[
            BubbleCauseOut(
                name=kind.name, label=kind.label, explanation=kind.explanation, color=CAUSE_COLORS[kind.name]
            )
            for kind in (*analysis.CAUSE_KINDS, *analysis.STEP_PARTS)
        ]
    )
