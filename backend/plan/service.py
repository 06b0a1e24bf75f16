"""The planner over HTTP: a validated request in, the planner's answer out (its ``PlanInputError``
names the field; ``backend/errors.py`` makes it a 422)."""

from __future__ import annotations

from bubblescope.analysis import plan_document
from bubblescope.backend.plan.schemas import PlanOut, PlanRequestIn


def plan(request: PlanRequestIn) -> PlanOut:
    return PlanOut.model_validate(plan_document(request.model_dump(exclude_none=True)).as_dict())
