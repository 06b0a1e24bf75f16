"""Alert delivery: what the evaluator calls when an alert opens or resolves, and the tasks that send.

The evaluator, in the transaction that opens or resolves an alert, calls ``enqueue_notifications``
(a row per ``--webhook-url`` in the outbox, nothing else: no network on the ingest path) and, once
committed, ``app.state.background.wake(DELIVERY_TASK)``. ``install_delivery`` (from ``create_app``)
registers one background task per webhook URL (``webhook.WebhookSender``: the outbox, polled every
``WEBHOOK_POLL_S``) and per Alertmanager (``alertmanager.AlertmanagerPusher``: every
``--alert-resend``), each its own thread, so a slow or failing target delays no other; and the task
named ``DELIVERY_TASK``, whose only work is to wake them all. Nothing is registered when no target is
configured. What a receiver gets: docs/alerting.md.
"""

from __future__ import annotations

from typing import Literal

from fastapi import FastAPI
from sqlalchemy.orm import Session

from bubblescope.backend.alerts import delivery_queries as queries
from bubblescope.backend.alerts.alertmanager import AlertmanagerPusher
from bubblescope.backend.alerts.webhook import WebhookSender, read_secret
from bubblescope.backend.background import BackgroundTasks, PeriodicTask
from bubblescope.backend.db.models import Alert
from bubblescope.backend.settings import ServiceSettings

DELIVERY_TASK = "alert-delivery"
WEBHOOK_POLL_S = 1.0  # how often a webhook task looks for due retries (a wake sends new notifications at once)
WAKER_INTERVAL_S = 3600.0  # the DELIVERY_TASK only works when woken
DEFAULT_EXTERNAL_URL = "http://localhost"  # when the app was built without --external-url (tests)


def enqueue_notifications(
    session: Session, alert: Alert, status: Literal["firing", "resolved"], settings: ServiceSettings
) -> None:
    """Put ``alert``'s ``status`` in the outbox for every webhook, in the caller's transaction (idempotent:
    a notification already there stays as it is). Alertmanager needs no row: it is told from the alerts."""
    if not settings.webhook_urls:
        return
    if alert.id is None:
        session.flush()
    queries.add_pending(session, alert.id, status, settings.webhook_urls, queries.wall_clock())


def install_delivery(app: FastAPI) -> None:
    """Register the delivery tasks on ``app`` for its settings' webhooks and Alertmanagers; ValueError
    when ``--webhook-secret-file`` cannot be read (better at start than unsigned bodies later)."""
    settings: ServiceSettings = app.state.settings
    background: BackgroundTasks = app.state.background
    external_url = settings.external_url or DEFAULT_EXTERNAL_URL
    secret = read_secret(settings.webhook_secret_file) if settings.webhook_secret_file else None
    senders: list[PeriodicTask] = []
    for number, url in enumerate(dict.fromkeys(settings.webhook_urls), 1):
        sender = WebhookSender(url, app.state.session_factory, external_url, secret)
        senders.append(PeriodicTask(f"{DELIVERY_TASK}-webhook-{number}", WEBHOOK_POLL_S, sender.send_due))
    for number, url in enumerate(dict.fromkeys(settings.alertmanager_urls), 1):
        pusher = AlertmanagerPusher(url, app.state.session_factory, external_url, settings.alert_resend_s)
        senders.append(PeriodicTask(f"{DELIVERY_TASK}-alertmanager-{number}", settings.alert_resend_s, pusher.push))
    if not senders:
        return
    for task in senders:
        background.add(task)

    def wake_senders() -> None:
        for task in senders:
            task.wake()

    background.add(PeriodicTask(DELIVERY_TASK, WAKER_INTERVAL_S, wake_senders))
