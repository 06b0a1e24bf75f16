"""Alertmanager (API v2): every ``--alert-resend`` seconds, and at once when an alert opens or resolves,
``POST <url>/api/v2/alerts`` with

- every firing alert, its endsAt ``FIRING_ENDS_AFTER_RESENDS`` re-send intervals ahead (as Prometheus
  does): should this service stop, Alertmanager resolves them itself once that time has passed;
- the alerts resolved since the last successful push to this Alertmanager (less ``RESOLVED_OVERLAP``,
  for clocks and in-flight transactions), with their real endsAt. That moment lives in memory; after
  a (re)start the push includes those resolved in the last ``RESOLVED_AFTER_START``, and an
  Alertmanager that kept failing gets at most the last ``RESOLVED_AT_MOST``.

Re-sending an alert is harmless: Alertmanager merges alerts by their labels. A push that fails is
counted and retried at the next interval; each Alertmanager has its own task, so one that hangs
holds up neither the others nor the webhooks.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from bubblescope.backend.alerts import delivery_queries as queries
from bubblescope.backend.alerts.http_post import PostResult, post_json, shown
from bubblescope.backend.alerts.shape import alert_document
from bubblescope.backend.db.engine import transaction
from bubblescope.backend.service_metrics import ALERT_DELIVERIES

log = logging.getLogger("bubblescope.alerts.alertmanager")

FIRING_ENDS_AFTER_RESENDS = 4
RESOLVED_OVERLAP = timedelta(minutes=1)
RESOLVED_AFTER_START = timedelta(minutes=15)
RESOLVED_AT_MOST = timedelta(hours=24)
ALERTS_PER_POST = 500
TIMEOUT_S = 10.0
POSTABLE_FIELDS = ("labels", "annotations", "startsAt", "endsAt", "generatorURL")  # API v2's postableAlert


class AlertmanagerPusher:
    """Pushes the alerts to one Alertmanager (a task of its own)."""

    def __init__(self, url: str, session_factory: sessionmaker[Session], external_url: str, resend_s: float) -> None:
        self.endpoint = url.rstrip("/") + "/api/v2/alerts"
        self.session_factory = session_factory
        self.external_url = external_url
        self.resend = timedelta(seconds=resend_s)
        self.last_pushed_at: datetime | None = None  # when the last successful push started

    def push(self) -> None:
        started = queries.wall_clock()
        documents = self.documents(started)
        if not documents:  # nothing firing, nothing resolved since: nothing to say, no request
            self.last_pushed_at = started
            return
        result = self._post(documents)
        if result.delivered:
            self.last_pushed_at = started
            ALERT_DELIVERIES.labels("alertmanager", "delivered").inc()
            return
        ALERT_DELIVERIES.labels("alertmanager", "failed").inc()
        log.warning("bubblescope: Alertmanager %s refused or missed a push: %s", shown(self.endpoint), result.error)

    def resolved_since(self, now: datetime) -> datetime:
        if self.last_pushed_at is None:
            return now - RESOLVED_AFTER_START
        return max(self.last_pushed_at - RESOLVED_OVERLAP, now - RESOLVED_AT_MOST)

    def documents(self, now: datetime) -> list[dict[str, Any]]:
        with transaction(self.session_factory) as session:
            firing = queries.firing_alerts(session)
            resolved = queries.resolved_since(session, self.resolved_since(now))
        ends_at = now + FIRING_ENDS_AFTER_RESENDS * self.resend
        alerts = [alert_document(alert, self.external_url, ends_at=ends_at) for alert in firing]
        alerts += [alert_document(alert, self.external_url) for alert in resolved]
        return [_postable(alert) for alert in alerts]

    def _post(self, documents: list[dict[str, Any]]) -> PostResult:
        """Every document, ``ALERTS_PER_POST`` at a time; the first failure ends the push."""
        result = PostResult(None, None, retryable=False)
        for first in range(0, len(documents), ALERTS_PER_POST):
            body = json.dumps(documents[first : first + ALERTS_PER_POST]).encode()
            result = post_json(self.endpoint, body, {}, TIMEOUT_S)
            if not result.delivered:
                break
        return result


def _postable(document: dict[str, Any]) -> dict[str, Any]:
    """The fields API v2 takes; an endsAt before startsAt (clocks apart) would fail the whole request
    with 400, so it is moved to startsAt (both are ``shape.iso`` texts: they compare as times)."""
    postable = {field: document[field] for field in POSTABLE_FIELDS}
    postable["endsAt"] = max(postable["endsAt"], postable["startsAt"])
    return postable
