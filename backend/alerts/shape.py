"""An alert as Alertmanager and its receivers know it: one shape for the REST API, the push to
Alertmanager's API v2 and the webhooks.

``labels`` identify the alert (``alertname``, ``run``, ``severity``, and ``rank``/``host``/
``stage`` when it names one); its ``fingerprint`` is a hash of them, so the same condition on
the same run and rank is the same alert across evaluations and restarts. ``annotations`` carry
the figures (``summary``, ``description``, ``action``); ``generatorURL`` is the dashboard view
that shows the evidence.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from typing import Any, Literal

from bubblescope.backend.db.models import Alert
from bubblescope.backend.visible_text import visible_values

AlertStatus = Literal["firing", "resolved"]
ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's "not set" for endsAt


def fingerprint(labels: dict[str, str]) -> str:
    """16 hex digits over the sorted labels, like Alertmanager's own fingerprints."""
    text = "\x00".join(f"{name}\x00{labels[name]}" for name in sorted(labels))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def iso(moment: datetime) -> str:
    """RFC 3339 in UTC with milliseconds (SQLite hands back naive UTC datetimes)."""
    aware = moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)
    return aware.strftime("%Y-%m-%dT%H:%M:%S.") + f"{aware.microsecond // 1000:03d}Z"


def status_of(alert: Alert) -> AlertStatus:
    return "firing" if alert.ends_at is None else "resolved"


def generator_url(external_url: str, alert: Alert) -> str:
    return external_url.rstrip("/") + alert.evidence_path


def alert_document(alert: Alert, external_url: str, *, ends_at: datetime | None = None) -> dict[str, Any]:
    """The alert in the webhook format of Alertmanager (status, labels, annotations, startsAt,
    endsAt, generatorURL, fingerprint). ``ends_at``: the endsAt to send for a firing alert (a push
    to Alertmanager sets it a few re-send intervals ahead); by default Alertmanager's zero time."""
    ended = alert.ends_at if alert.ends_at is not None else ends_at
    return {
        "status": status_of(alert),
        "labels": visible_values(alert.labels),  # the job's words (a host, an error) cannot reorder the reader's
        "annotations": visible_values(alert.annotations),
        "startsAt": iso(alert.starts_at),
        "endsAt": iso(ended) if ended is not None else ZERO_TIME,
        "generatorURL": generator_url(external_url, alert),
        "fingerprint": alert.fingerprint,
    }
