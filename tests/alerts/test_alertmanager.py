"""The push to a real Alertmanager (Debian's ``prometheus-alertmanager``, API v2): it receives the firing
alert with its labels and an endsAt ahead, notifies its own webhook receiver, and sends the resolution
once the service pushes the alert resolved."""

from __future__ import annotations

import re
import subprocess
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from bubblescope.backend.alerts.alertmanager import RESOLVED_AFTER_START, RESOLVED_OVERLAP
from bubblescope.backend.db.engine import build_engine, build_session_factory
from bubblescope.backend.settings import ServiceSettings
from tests.alerts.alertmanager import running_alertmanager, webhook_route
from tests.alerts.receiver import WebhookReceiver, webhook_receiver
from tests.alerts.service import (
    counts_grew,
    delivery_counts,
    in_process_service,
    now,
    open_alert,
    resolve_alert,
    store_resolution,
)
from tests.support import REPO, register, require_program, wait_until

RESEND_S = 30.0  # the test's pushes come from wakes (an alert opened or resolved), not from this clock
NOTIFY_TIMEOUT_S = 60
EXTERNAL_URL = "https://bubblescope.example.org"
AMTOOL = "/usr/bin/amtool"


def notification(receiver: WebhookReceiver, run_key: str, status: str) -> dict[str, Any]:
    """The first notification Alertmanager sent about ``run_key`` with ``status``."""

    def found() -> dict[str, Any] | None:
        for request in receiver.requests():
            body = request.json()
            if body["status"] == status and any(alert["labels"].get("run") == run_key for alert in body["alerts"]):
                return dict(body)
        return None

    wait_until(lambda: found() is not None, NOTIFY_TIMEOUT_S, f"Alertmanager's {status} notification")
    body = found()
    assert body is not None
    return body


def parsed(moment: str) -> datetime:
    return datetime.fromisoformat(moment.replace("Z", "+00:00"))


def test_alertmanager_gets_the_alert_and_notifies_firing_then_resolved(alerts_db: str, tmp_path: Path) -> None:
    with (
        webhook_receiver() as receiver,
        running_alertmanager(tmp_path / "alertmanager", webhook_route(receiver.url)) as alertmanager,
    ):
        settings = ServiceSettings(
            alertmanager_urls=(alertmanager,), alert_resend_s=RESEND_S, external_url=EXTERNAL_URL
        )
        with in_process_service(alerts_db, settings) as service, service.client() as client:
            before = delivery_counts(client, "alertmanager")
            key = register(client)
            alert_id = open_alert(service, key)
            firing = notification(receiver, key, "firing")
            (held,) = httpx.get(f"{alertmanager}/api/v2/alerts", params={"filter": f'run="{key}"'}, timeout=10).json()
            resolve_alert(service, alert_id)
            resolved = notification(receiver, key, "resolved")
            grew = counts_grew(before, delivery_counts(client, "alertmanager"))

    (alert,) = firing["alerts"]
    assert alert["labels"] == {"alertname": "StepTimeRegression", "run": key, "severity": "warning"}
    assert alert["annotations"]["summary"] == f"{key}: step time regressed"
    assert alert["generatorURL"] == f"{EXTERNAL_URL}/runs/{key}"
    # firing, it ends a few re-sends ahead: Alertmanager resolves it itself should the service die
    assert held["status"]["state"] == "active"
    assert parsed(held["startsAt"]) < parsed(held["endsAt"])
    (ended,) = resolved["alerts"]
    assert ended["labels"] == alert["labels"] and ended["startsAt"] == alert["startsAt"]
    assert parsed(ended["endsAt"]) < parsed(held["endsAt"])  # the real end, not the one ahead
    assert grew["delivered"] >= 2 and grew["failed"] == 0


def test_a_restarted_service_tells_alertmanager_of_what_resolved_while_it_was_down(
    alerts_db: str, tmp_path: Path
) -> None:
    with (
        webhook_receiver() as receiver,
        running_alertmanager(tmp_path / "alertmanager", webhook_route(receiver.url)) as alertmanager,
    ):
        settings = ServiceSettings(alertmanager_urls=(alertmanager,), alert_resend_s=RESEND_S)
        with in_process_service(alerts_db, settings) as first, first.client() as client:
            key = register(client)
            alert_id = open_alert(first, key, started=now() - timedelta(minutes=10))
            notification(receiver, key, "firing")
        # While the service is down, the alert resolves: minutes ago, beyond the overlap any push has
        # with the one before it, within the window a service's first push covers.
        ended = now() - (RESOLVED_OVERLAP + RESOLVED_AFTER_START) / 2
        engine = build_engine(alerts_db)
        try:
            store_resolution(build_session_factory(engine), alert_id, settings, ended)
        finally:
            engine.dispose()
        with in_process_service(alerts_db, settings):
            resolved = notification(receiver, key, "resolved")
    (ended,) = resolved["alerts"]
    assert ended["labels"]["run"] == key and ended["status"] == "resolved"
    assert parsed(ended["endsAt"]) < parsed(ended["startsAt"]) + timedelta(minutes=10)  # its real end


def test_the_routing_example_in_the_docs_is_a_valid_alertmanager_configuration(tmp_path: Path) -> None:
    require_program(AMTOOL, "prometheus-alertmanager")
    (config,) = re.findall(r"```yaml\n(.*?)```", (REPO / "docs" / "alerting.md").read_text(), re.S)
    assert "routing_key_file" in config and "slack_configs" in config
    (tmp_path / "alertmanager.yml").write_text(config)
    checked = subprocess.run(
        [AMTOOL, "check-config", str(tmp_path / "alertmanager.yml")], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
