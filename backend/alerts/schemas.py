"""The alerts endpoint's answer: Alertmanager's webhook shape, plus the run's key and the alert's id."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from bubblescope.analysis.alert_rules import RULES

if TYPE_CHECKING:
    AlertName = str
else:  # an enum of the rules' names in the OpenAPI document
    AlertName = Literal[tuple(rule.alertname for rule in RULES)]
PositiveSeconds = Annotated[float, Field(gt=0, le=30 * 86400, allow_inf_nan=False)]


class AlertOut(BaseModel):
    id: int
    run: str = Field(description="the run's key (also in labels.run)")
    status: Literal["firing", "resolved"]
    labels: dict[str, str] = Field(description="alertname, run, severity, and rank/host/stage when it names one")
    annotations: dict[str, str] = Field(description="summary, description (the figures), action (what to do)")
    startsAt: str
    endsAt: str = Field(description="0001-01-01T00:00:00Z while firing")
    generatorURL: str = Field(description="the dashboard view that shows the evidence")
    fingerprint: str = Field(description="16 hex digits over the labels: stable across evaluations and restarts")


class AlertList(BaseModel):
    alerts: list[AlertOut]


class AlertOverrides(BaseModel):
    """A run's own alert thresholds (its config's ``alerts`` key): each replaces the ``serve`` option
    of the same name for this run; ``disabled`` turns rules off."""

    model_config = ConfigDict(extra="forbid")

    hung_after_s: PositiveSeconds | None = None
    regression_percent: Annotated[float, Field(gt=0, le=10_000)] | None = None
    regression_for_s: PositiveSeconds | None = None
    bubble_over_floor_points: Annotated[float, Field(gt=0, le=100)] | None = None
    bubble_for_steps: Annotated[int, Field(ge=1, le=10_000)] | None = None
    disabled: Annotated[list[AlertName], Field(max_length=len(RULES))] | None = None
