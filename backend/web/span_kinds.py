"""GET /api/v1/span-kinds: every span kind with its category and colour, for the dashboard.

The one home of the dashboard's span colours. The kinds and their categories are ``bubblescope.wire``'s
(``COMPUTE_KINDS``, ``COMMUNICATION_KINDS``); a kind added there needs a colour here, which
``tests/dashboard/test_span_kinds.py`` checks."""

from __future__ import annotations

from typing import Final, Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from bubblescope import wire

Category = Literal["compute", "communication"]

CATEGORY_COLORS: Final[dict[Category, str]] = {"compute": "#2f6fde", "communication": "#8e5bd0"}

# In the order the timeline's legend lists them: compute first, then point-to-point, then collectives.
KIND_COLORS: Final[dict[str, str]] = {
    "forward": CATEGORY_COLORS["compute"],
    "backward": "#f08c2e",
    "backward_input": "#f0a35e",
    "backward_weight": "#c46a12",
    "optimizer": "#2e9e5b",
    "data_loading": "#9aa3b2",
    "send": CATEGORY_COLORS["communication"],
    "recv": "#d0457a",
    "all_reduce": "#0f9fb0",
    "all_gather": "#13b3a0",
    "reduce_scatter": "#5fc2d6",
    "all_to_all": "#7a86c2",
    "broadcast": "#b06fb0",
}


class SpanKindOut(BaseModel):
    kind: str
    category: Category
    color: str = Field(description="CSS colour the dashboard draws this kind's spans with")


class CategoryOut(BaseModel):
    category: Category
    color: str = Field(description="CSS colour of the category's share of a rank's time")


class SpanKindsOut(BaseModel):
    kinds: list[SpanKindOut]
    categories: list[CategoryOut]
    block_separator: str = Field(
        description="a compute span whose name holds it is a block's (a model's layer, a pipeline stage's layer), "
        "nested in its model's or stage's span"
    )


def category_of(kind: str) -> Category:
    if kind in wire.COMPUTE_KINDS:
        return "compute"
    if kind in wire.COMMUNICATION_KINDS:
        return "communication"
    raise KeyError(f"{kind!r} is not a span kind of bubblescope.wire")


router = APIRouter(prefix=wire.API_PREFIX, tags=["meta"])


@router.get("/span-kinds", response_model=SpanKindsOut, summary="Span kinds with their category and colour")
def get_span_kinds() -> SpanKindsOut:
    return SpanKindsOut(
        kinds=[SpanKindOut(kind=kind, category=category_of(kind), color=color) for kind, color in KIND_COLORS.items()],
        categories=[CategoryOut(category=name, color=color) for name, color in CATEGORY_COLORS.items()],
        block_separator=wire.BLOCK_SEPARATOR,
    )
