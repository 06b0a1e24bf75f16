"""Webhooks: each alert's firing and resolution, sent from the outbox to every ``--webhook-url``.

The body is Alertmanager's webhook payload (version 4) with one alert in it, plus ``dedupKey``,
which is the same for every attempt at one notification: stable per (fingerprint, startsAt, status).
The body of a notification is the same bytes on each attempt (unless the alert's annotations
changed meanwhile). Headers:

- ``X-Bubblescope-Signature: sha256=<hex>``: HMAC-SHA256 of the exact body bytes, keyed with the
  content of ``--webhook-secret-file`` (surrounding whitespace removed); absent without that option;
- ``X-Bubblescope-Dedup-Key``: the body's ``dedupKey``;
- ``X-Bubblescope-Timestamp``: when this attempt was sent, in Unix seconds.

A failed attempt is retried with exponential backoff (``RETRY_FIRST_S`` doubling up to
``RETRY_MAX_S``, or the answer's Retry-After when longer) on no answer, 5xx, 408 and 429, until
``GIVE_UP_AFTER`` past the alert's transition; any other answer gives up at once.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from sqlalchemy.orm import Session, sessionmaker

from bubblescope.backend.alerts import delivery_queries as queries
from bubblescope.backend.alerts.http_post import PostResult, post_json, shown
from bubblescope.backend.alerts.shape import ZERO_TIME, alert_document, iso
from bubblescope.backend.db.engine import transaction
from bubblescope.backend.db.models import Alert
from bubblescope.backend.db.timestamps import as_utc
from bubblescope.backend.service_metrics import ALERT_DELIVERIES

log = logging.getLogger("bubblescope.alerts.webhook")

PAYLOAD_VERSION = "4"  # Alertmanager's webhook payload version
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 300.0
GIVE_UP_AFTER = timedelta(hours=24)
TIMEOUT_S = 10.0
LEASE = timedelta(seconds=120)  # longer than an attempt can take; a crashed sender's row is due again after it
MAX_PER_ROUND = 50


def dedup_key(alert: Alert, status: Literal["firing", "resolved"]) -> str:
    text = f"{alert.fingerprint}\x00{iso(alert.starts_at)}\x00{status}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def webhook_body(alert: Alert, status: Literal["firing", "resolved"], external_url: str) -> bytes:
    """The notification of ``alert``'s ``status`` (a firing sent late, after the alert resolved, still says firing)."""
    document = alert_document(alert, external_url)
    if status == "firing":
        document |= {"status": "firing", "endsAt": ZERO_TIME}
    payload: dict[str, Any] = {
        "version": PAYLOAD_VERSION,
        "groupKey": alert.fingerprint,
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "bubblescope",
        "groupLabels": document["labels"],
        "commonLabels": document["labels"],
        "commonAnnotations": document["annotations"],
        "externalURL": external_url,
        "alerts": [document],
        "dedupKey": dedup_key(alert, status),
    }
    return json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()


def signature(key: bytes, body: bytes) -> str:
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


def read_secret(path: str) -> bytes:
    """The signing key in ``path``; ValueError naming the option when it cannot be used."""
    try:
        key = Path(path).read_bytes().strip()
    except OSError as error:
        raise ValueError(f"--webhook-secret-file {path}: {error.strerror or error}") from None
    if not key:
        raise ValueError(f"--webhook-secret-file {path} is empty")
    return key


def retry_delay_s(attempts: int, result: PostResult) -> float:
    backoff = RETRY_FIRST_S * 2.0 ** min(attempts - 1, 30)
    return min(max(backoff, result.retry_after_s or 0.0), RETRY_MAX_S)


class WebhookSender:
    """Sends one webhook URL's due notifications, oldest first, one at a time (a task of its own)."""

    def __init__(
        self, url: str, session_factory: sessionmaker[Session], external_url: str, secret: bytes | None
    ) -> None:
        self.url = url
        self.session_factory = session_factory
        self.external_url = external_url
        self.secret = secret

    def send_due(self) -> None:
        for _ in range(MAX_PER_ROUND):
            now = queries.wall_clock()
            with transaction(self.session_factory) as session:
                claimed = queries.claim_next(session, self.url, now, now + LEASE)
            if claimed is None:
                return
            result = self._send(claimed)
            self._record(claimed, result)

    def _send(self, claimed: queries.Claimed) -> PostResult:
        body = webhook_body(claimed.alert, claimed.status, self.external_url)
        now = queries.wall_clock()
        headers = {
            "X-Bubblescope-Dedup-Key": dedup_key(claimed.alert, claimed.status),
            "X-Bubblescope-Timestamp": str(int(now.timestamp())),
        }
        if self.secret is not None:
            headers["X-Bubblescope-Signature"] = signature(self.secret, body)
        return post_json(self.url, body, headers, TIMEOUT_S)

    def _record(self, claimed: queries.Claimed, result: PostResult) -> None:
        now = queries.wall_clock()
        with transaction(self.session_factory) as session:
            if result.delivered:
                queries.mark_delivered(session, claimed.delivery_id, now)
                outcome = "delivered"
            elif result.retryable and now - transition_at(claimed) < GIVE_UP_AFTER:
                retry_at = now + timedelta(seconds=retry_delay_s(claimed.attempts, result))
                queries.mark_failed(session, claimed.delivery_id, result.error or "", retry_at)
                outcome = "failed"
            else:
                queries.mark_given_up(session, claimed.delivery_id, result.error or "")
                outcome = "given_up"
        ALERT_DELIVERIES.labels("webhook", outcome).inc()
        if outcome != "delivered":
            log.warning(
                "bubblescope: webhook %s, %s of alert %s (attempt %d): %s; %s",
                shown(self.url),
                claimed.status,
                claimed.alert.alertname,
                claimed.attempts,
                result.error,
                "will retry" if outcome == "failed" else "gave up",
            )


def transition_at(claimed: queries.Claimed) -> datetime:
    """When the notified change happened: the alert's start, or its end for a resolution."""
    alert = claimed.alert
    moment = alert.ends_at if claimed.status == "resolved" and alert.ends_at is not None else alert.starts_at
    return as_utc(moment)
