"""A real service in this process (uvicorn on a free loopback port, ``create_app`` as ``serve`` builds
it), so a test can do what the alert evaluator does: store an alert, ``enqueue_notifications`` in the
same transaction, then wake the delivery task. The service runs without its alert rules' task: the
test plays the evaluator, and the real one would resolve the test's alerts (no rule finds them)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

import httpx
import uvicorn
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from bubblescope.backend.alerts.delivery import DELIVERY_TASK, enqueue_notifications
from bubblescope.backend.alerts.evaluator import ALERT_TASK
from bubblescope.backend.alerts.shape import fingerprint
from bubblescope.backend.db.engine import transaction
from bubblescope.backend.db.models import Alert, AlertDelivery, Run
from bubblescope.backend.server import build_server, start_in_thread
from bubblescope.backend.settings import ServiceSettings
from tests.support import free_port

STOP_TIMEOUT_S = 30


@dataclass
class InProcessService:
    url: str
    app: FastAPI
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def settings(self) -> ServiceSettings:
        settings: ServiceSettings = self.app.state.settings
        return settings

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(STOP_TIMEOUT_S)
        assert not self.thread.is_alive(), "the service did not stop"


@contextmanager
def in_process_service(db_url: str, settings: ServiceSettings) -> Iterator[InProcessService]:
    port = free_port()
    server = build_server(db_url, "127.0.0.1", port, settings)
    server.config.app.state.background.tasks.pop(ALERT_TASK)  # before the lifespan starts the tasks
    thread = start_in_thread(server)
    service = InProcessService(f"http://127.0.0.1:{port}", server.config.app, server, thread)
    try:
        yield service
    finally:
        if thread.is_alive():
            service.stop()


def now() -> datetime:
    return datetime.now(timezone.utc)


def open_alert(
    service: InProcessService, run_key: str, alertname: str = "StepTimeRegression", started: datetime | None = None
) -> int:
    """Store a firing alert on the run (since ``started``, by default now) and enqueue its notification,
    as the evaluator does; its id."""
    labels = {"alertname": alertname, "run": run_key, "severity": "warning"}
    annotations = {
        "summary": f"{run_key}: step time regressed",
        "description": "median step 1.40 s against a baseline of 1.00 s (+40%)",
        "action": "open the run's stragglers view",
    }
    started = started or now()
    with transaction(service.app.state.session_factory) as session:
        run_id = session.scalars(select(Run.id).where(Run.key == run_key)).one()
        alert = Alert(
            run_id=run_id,
            fingerprint=fingerprint(labels),
            alertname=alertname,
            severity="warning",
            labels=labels,
            annotations=annotations,
            evidence_path=f"/runs/{run_key}",
            starts_at=started,
            ends_at=None,
            updated_at=started,
        )
        session.add(alert)
        session.flush()
        enqueue_notifications(session, alert, "firing", service.settings)
        alert_id = alert.id
    service.app.state.background.wake(DELIVERY_TASK)
    return alert_id


def resolve_alert(service: InProcessService, alert_id: int) -> None:
    """Resolve the alert and enqueue its notification, as the evaluator does."""
    store_resolution(service.app.state.session_factory, alert_id, service.settings)
    service.app.state.background.wake(DELIVERY_TASK)


def store_resolution(
    session_factory: sessionmaker[Session], alert_id: int, settings: ServiceSettings, ended: datetime | None = None
) -> None:
    """The resolution (at ``ended``, by default now) in the database; nothing is woken (no service may run)."""
    ended = ended or now()
    with transaction(session_factory) as session:
        alert = session.get_one(Alert, alert_id)
        alert.ends_at = ended
        alert.updated_at = ended
        enqueue_notifications(session, alert, "resolved", settings)


def delivery_counts(client: httpx.Client, target: Literal["webhook", "alertmanager"]) -> dict[str, float]:
    """``bubblescope_alert_deliveries_total`` for ``target`` by outcome, read from GET /metrics."""
    text = client.get("/metrics").text
    return {
        sample.labels["outcome"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "bubblescope_alert_deliveries_total" and sample.labels["target"] == target
    }


def counts_grew(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {outcome: after.get(outcome, 0) - before.get(outcome, 0) for outcome in after}


def delivery_rows(service: InProcessService, alert_id: int) -> list[dict[str, Any]]:
    with transaction(service.app.state.session_factory) as session:
        rows = session.scalars(
            select(AlertDelivery).where(AlertDelivery.alert_id == alert_id).order_by(AlertDelivery.id)
        )
        return [
            {
                "status": row.status,
                "target": row.target,
                "attempts": row.attempts,
                "delivered": row.delivered_at is not None,
                "next_attempt_at": row.next_attempt_at,
                "last_error": row.last_error,
            }
            for row in rows
        ]
