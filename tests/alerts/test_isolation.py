"""Each target has its own thread: an Alertmanager that takes a push and never answers holds up neither
the webhooks nor another Alertmanager. (A module of its own, so its database holds no alert before the
test's: the hanging Alertmanager's first push is the test's alert.)"""

from __future__ import annotations

from pathlib import Path

from bubblescope.backend.alerts import alertmanager as pusher
from bubblescope.backend.settings import ServiceSettings
from tests.alerts.alertmanager import running_alertmanager, webhook_route
from tests.alerts.receiver import webhook_receiver
from tests.alerts.service import counts_grew, delivery_counts, in_process_service, open_alert
from tests.alerts.test_alertmanager import notification
from tests.support import register


def test_a_hanging_alertmanager_holds_up_neither_webhooks_nor_another_alertmanager(
    alerts_db: str, tmp_path: Path
) -> None:
    with (
        webhook_receiver() as webhook,
        webhook_receiver(hangs=True) as hanging,
        webhook_receiver() as notified,
        running_alertmanager(tmp_path / "alertmanager", webhook_route(notified.url)) as alertmanager,
    ):
        hanging_base = f"http://127.0.0.1:{hanging.port}"
        settings = ServiceSettings(
            alertmanager_urls=(hanging_base, alertmanager), webhook_urls=(webhook.url,), alert_resend_s=300
        )
        with in_process_service(alerts_db, settings) as service, service.client() as client:
            before = delivery_counts(client, "alertmanager")
            key = register(client)
            open_alert(service, key)
            (push,) = hanging.wait_for(1)
            webhook.wait_for(1)
            notification(notified, key, "firing")
            meanwhile = counts_grew(before, delivery_counts(client, "alertmanager"))
            hanging.stop()  # its push gets an answer now, so the service stops without waiting for it
    assert push.path == "/api/v2/alerts"
    # the hanging push had not failed yet (it fails after the push timeout), and nothing waited for it
    assert meanwhile == {"delivered": 1, "failed": 0}, (meanwhile, pusher.TIMEOUT_S)
