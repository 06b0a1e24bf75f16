"""The planner over HTTP: a validated request in, the planner's answer out (its ``PlanInputError``
names the field; ``backend/errors.py`` makes it a 422)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bubblescope.analysis import PlanInputError, plan_document
from bubblescope.backend.errors import Invalid
from bubblescope.backend.plan.schemas import PlanOut, PlanRequestIn

#: The request's parts given as a name or as an object of fields; the schema names an object's fields under ``fields``.
NAMED_OR_FIELDS = ("model", "cluster", "gpu")


def plan(request: PlanRequestIn) -> PlanOut:
    document = request.model_dump(exclude_none=True)
    try:
        outcome = plan_document(document)
    except PlanInputError as error:
        raise Invalid(located(error.path, document), error.message) from None
    return PlanOut.model_validate(outcome.as_dict())


def located(path: tuple[str, ...], document: Mapping[str, Any]) -> tuple[str, ...]:
    """The planner's ``path`` where the schema would name it: a field of a model, cluster or GPU given as an object
    under ``fields`` (``model.fields.top_k``), as the schema's own errors are, not beside them (``model.top_k``)."""
    located_path: list[str] = []
    node: Any = document
    for depth, part in enumerate(path):
        located_path.append(part)
        node = node.get(part) if isinstance(node, Mapping) else None
        if part in NAMED_OR_FIELDS and isinstance(node, Mapping) and depth < len(path) - 1:
            located_path.append("fields")
    return tuple(located_path)
