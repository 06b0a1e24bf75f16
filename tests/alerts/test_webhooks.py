"""Webhook delivery from the outbox: a real service sends each alert's firing and resolution to a real
HTTP receiver, signed; retries keep the dedup key; refusals give up; a restart forgets nothing."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from bubblescope.backend.alerts.delivery_queries import GIVEN_UP
from bubblescope.backend.alerts.shape import ZERO_TIME
from bubblescope.backend.db.timestamps import as_utc
from bubblescope.backend.settings import ServiceSettings
from tests.alerts.receiver import Received, WebhookReceiver, unique_path, webhook_receiver
from tests.alerts.service import (
    InProcessService,
    counts_grew,
    delivery_counts,
    delivery_rows,
    in_process_service,
    open_alert,
    resolve_alert,
)
from tests.support import free_port, register, wait_until

SECRET = b"a shared webhook key"
EXTERNAL_URL = "https://bubblescope.example.org"


def verified(request: Received, key: bytes) -> bool:
    """What a receiver does: HMAC-SHA256 of the raw body, compared in constant time (docs/alerting.md)."""
    expected = "sha256=" + hmac.new(key, request.body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, request.headers.get("x-bubblescope-signature", ""))


@contextmanager
def webhook_service(
    db_url: str, *, statuses: Sequence[int] = (), **settings: Any
) -> Iterator[tuple[WebhookReceiver, InProcessService, httpx.Client]]:
    """A receiver answering ``statuses`` (then 200) and a service whose only webhook it is."""
    with (
        webhook_receiver(statuses) as receiver,
        in_process_service(db_url, ServiceSettings(webhook_urls=(receiver.url,), **settings)) as service,
        service.client() as client,
    ):
        yield receiver, service, client


def test_firing_then_resolved_arrive_signed_with_their_dedup_keys(alerts_db: str, tmp_path: Path) -> None:
    secret_file = tmp_path / "webhook.key"
    secret_file.write_bytes(SECRET + b"\n")  # as `echo` writes it: the newline is not part of the key
    settings = {"webhook_secret_file": str(secret_file), "external_url": EXTERNAL_URL}
    with webhook_service(alerts_db, **settings) as (receiver, service, client):
        key = register(client)
        alert_id = open_alert(service, key)
        (firing,) = receiver.wait_for(1)
        resolve_alert(service, alert_id)
        firing, resolved = receiver.wait_for(2)
        wait_until(lambda: all(row["delivered"] for row in delivery_rows(service, alert_id)), 30, "both delivered")

    for request, status in ((firing, "firing"), (resolved, "resolved")):
        assert request.path == receiver.path
        assert request.headers["content-type"] == "application/json"
        assert verified(request, SECRET), request.headers
        assert not verified(request, SECRET + b"\n")
        body = request.json()
        assert body["status"] == status and body["version"] == "4"
        assert request.headers["x-bubblescope-dedup-key"] == body["dedupKey"]
        assert int(request.headers["x-bubblescope-timestamp"]) > 1_700_000_000
        assert body["externalURL"] == EXTERNAL_URL
        (alert,) = body["alerts"]
        assert alert["status"] == status
        assert alert["labels"] == {"alertname": "StepTimeRegression", "run": key, "severity": "warning"}
        assert alert["annotations"]["summary"] == f"{key}: step time regressed"
        assert alert["generatorURL"] == f"{EXTERNAL_URL}/runs/{key}"
    assert firing.json()["alerts"][0]["endsAt"] == ZERO_TIME
    assert resolved.json()["alerts"][0]["endsAt"] != ZERO_TIME
    assert firing.json()["alerts"][0]["startsAt"] == resolved.json()["alerts"][0]["startsAt"]
    assert firing.json()["dedupKey"] != resolved.json()["dedupKey"]


def test_a_failing_receiver_gets_retries_with_one_dedup_key_and_metrics_count_them(alerts_db: str) -> None:
    with webhook_service(alerts_db, statuses=[500, 500]) as (receiver, service, client):  # then 200
        before = delivery_counts(client, "webhook")
        alert_id = open_alert(service, register(client))
        attempts = receiver.wait_for(3, timeout_s=60)
        wait_until(lambda: delivery_rows(service, alert_id)[0]["delivered"], 30, "the delivery recorded")
        grew = counts_grew(before, delivery_counts(client, "webhook"))
        (row,) = delivery_rows(service, alert_id)

    assert len({request.headers["x-bubblescope-dedup-key"] for request in attempts}) == 1
    assert len({request.body for request in attempts}) == 1  # the same bytes each time
    assert "x-bubblescope-signature" not in attempts[0].headers  # no --webhook-secret-file, no signature
    assert grew == {"delivered": 1, "failed": 2, "given_up": 0}
    assert row["attempts"] == 3 and row["last_error"] is None


def test_a_refusal_gives_up_at_once(alerts_db: str) -> None:
    with webhook_service(alerts_db, statuses=[410]) as (receiver, service, client):
        before = delivery_counts(client, "webhook")
        alert_id = open_alert(service, register(client))
        receiver.wait_for(1)
        wait_until(lambda: delivery_rows(service, alert_id)[0]["last_error"], 30, "the refusal recorded")
        grew = counts_grew(before, delivery_counts(client, "webhook"))
        (row,) = delivery_rows(service, alert_id)

    assert grew == {"delivered": 0, "failed": 0, "given_up": 1}
    assert not row["delivered"] and as_utc(row["next_attempt_at"]) == GIVEN_UP
    assert row["last_error"].startswith("gave up: HTTP 410")


def test_a_resolution_waits_for_its_firing(alerts_db: str) -> None:
    with webhook_service(alerts_db, statuses=[503]) as (receiver, service, client):  # the firing's first try fails
        alert_id = open_alert(service, register(client))
        receiver.wait_for(1)
        resolve_alert(service, alert_id)  # due at once, while the firing waits for its retry
        requests = receiver.wait_for(3)

    assert [request.json()["status"] for request in requests] == ["firing", "firing", "resolved"]


def test_a_new_service_on_the_same_database_delivers_what_the_old_one_could_not(alerts_db: str) -> None:
    port, path = free_port(), unique_path()  # nothing listens there while the first service runs
    settings = ServiceSettings(webhook_urls=(f"http://127.0.0.1:{port}{path}",))
    with in_process_service(alerts_db, settings) as first, first.client() as client:
        key = register(client)
        alert_id = open_alert(first, key)
        wait_until(lambda: delivery_rows(first, alert_id)[0]["attempts"] >= 1, 30, "a first attempt")
        first.stop()
        (pending,) = delivery_rows(first, alert_id)
    assert not pending["delivered"] and pending["last_error"].startswith("no answer"), pending

    with webhook_receiver(port=port, path=path) as receiver, in_process_service(alerts_db, settings) as second:
        (request,) = receiver.wait_for(1)
        wait_until(lambda: delivery_rows(second, alert_id)[0]["delivered"], 30, "the delivery recorded")
    body = request.json()
    assert body["status"] == "firing" and body["alerts"][0]["labels"]["run"] == key


def test_serve_refuses_an_unreadable_webhook_secret_in_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    missing = tmp_path / "no-such-secret"
    command = [sys.executable, "-m", "bubblescope.cli", "serve", "--db", str(tmp_path / "db.sqlite"), "--port", "9"]
    done = subprocess.run(
        [*command, "--webhook-url", "http://127.0.0.1:9/hook", "--webhook-secret-file", str(missing)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"bubblescope serve: --webhook-secret-file {missing}: No such file or directory"
    ]
