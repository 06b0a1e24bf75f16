"""The whole path an on-call page takes, every part real: a torchrun job whose rank 1 hangs before the
gradient all-reduce → the service's rules (a `serve` process) → Debian's Alertmanager (API v2) → the
receiver Alertmanager notifies (where PagerDuty or Slack would be). The page names the rank and host,
links to the blocked-ranks view, and a resolution follows once the rank moves again."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.alerts.alertmanager import running_alertmanager, webhook_route
from tests.alerts.fault_jobs import finish, kill_job, launch
from tests.alerts.receiver import webhook_receiver
from tests.alerts.test_alertmanager import notification
from tests.support import LiveServer, migrated_database, start_server

pytestmark = [pytest.mark.slow, pytest.mark.timing]
EXTERNAL_URL = "https://bubblescope.example.org"


@pytest.fixture
def database(tmp_path: Path) -> Iterator[str]:
    with migrated_database("sqlite", tmp_path / "db") as url:
        yield url


def test_a_hung_rank_pages_through_alertmanager_and_the_page_resolves(database: str, tmp_path: Path) -> None:
    run_key = f"paged-{uuid.uuid4().hex[:8]}"
    with (
        webhook_receiver() as receiver,
        running_alertmanager(tmp_path / "alertmanager", webhook_route(receiver.url)) as alertmanager,
    ):
        serve = ["--hung-after", "4", "--alert-interval", "1", "--silent-after", "60"]
        serve += ["--alertmanager-url", alertmanager, "--alert-resend", "5", "--external-url", EXTERNAL_URL]
        live: LiveServer = start_server(database, tmp_path, extra_args=serve)
        job = launch(
            live.url, run_key, 2, "--steps=20", "--inject=hang-collective", "--inject-rank=1", "--inject-seconds=14"
        )
        try:
            firing = notification(receiver, run_key, "firing")
            resolved = notification(receiver, run_key, "resolved")
            output = finish(job)
        finally:
            kill_job(job)
            live.stop()
    assert job.returncode == 0, output[-3000:]
    (paged,) = [a for a in firing["alerts"] if a["labels"]["alertname"] == "BubblescopeRunHung"]
    assert paged["labels"]["rank"] == "1" and paged["labels"]["host"] == socket.gethostname(), paged
    assert paged["labels"]["severity"] == "critical"
    assert "rank 0 waits in all_reduce 'grad_norm'" in paged["annotations"]["description"]
    assert paged["generatorURL"] == f"{EXTERNAL_URL}/runs/{run_key}?view=hung#ranks"
    (ended,) = [a for a in resolved["alerts"] if a["labels"]["alertname"] == "BubblescopeRunHung"]
    assert ended["labels"] == paged["labels"] and ended["startsAt"] == paged["startsAt"]
