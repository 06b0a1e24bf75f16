"""The alerts endpoint's answer: Alertmanager's webhook shape, plus the run's key and the alert's id."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


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
