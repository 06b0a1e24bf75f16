"""A healthy job streaming through a service that is killed (SIGKILL) mid-run and restarted 12 s later on the
same port and database: the collector spools and delivers every step once the service is back, and no alert
fires at any point, though the steps of the outage all arrive at once (the rules read the steps' own aligned
times, never when their batches arrived)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.alerts.fault_jobs import alerts, finish, launch
from tests.support import LiveServer, migrated_database, start_server, wait_for_steps

pytestmark = [pytest.mark.slow, pytest.mark.timing]
SERVE = ["--alert-interval", "1", "--silent-after", "60", "--hung-after", "30", "--regression-for", "5"]
STEPS = 160
OUTAGE_S = 12.0


@pytest.fixture
def database(tmp_path: Path) -> Iterator[str]:
    with migrated_database("sqlite", tmp_path / "db") as url:
        yield url


def test_a_service_outage_and_the_catch_up_after_it_raise_nothing(database: str, tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    first = start_server(database, tmp_path / "logs", extra_args=SERVE)
    port = int(first.url.rsplit(":", 1)[1])
    run_key = f"outage-{uuid.uuid4().hex[:8]}"
    job = launch(first.url, run_key, 2, f"--steps={STEPS}", "--hidden=256", "--device-ms=5", "--microbatches=8")
    raised: list[dict[str, object]] = []
    second: LiveServer | None = None
    try:
        with first.client() as client:
            wait_for_steps(client, run_key, 2, 30, timeout_s=180)
            before = client.get(f"/api/v1/runs/{run_key}").json()["step_count"]
        first.process.kill()  # as the OOM killer or a node loss would
        first.process.wait(30)
        time.sleep(OUTAGE_S)
        second = start_server(database, tmp_path / "logs", port=port, extra_args=SERVE)
        with second.client() as client:
            deadline = time.monotonic() + 240
            while job.poll() is None and time.monotonic() < deadline:
                raised += [a for a in alerts(client, run_key) if a not in raised]
                time.sleep(0.5)
            output = finish(job)
            assert job.returncode == 0, output[-3000:]
            wait_for_steps(client, run_key, 2, STEPS, timeout_s=60)
            time.sleep(3)  # evaluation rounds after the last batch
            raised += [a for a in alerts(client, run_key) if a not in raised]
            run = client.get(f"/api/v1/runs/{run_key}").json()
    finally:
        if job.poll() is None:
            finish(job, timeout_s=5)
        if second is not None:
            second.stop()
    assert before < STEPS, "the service should go down mid-run"
    assert run["step_count"] == STEPS and run["state"] == "finished", run["state_detail"]
    assert raised == [], [(a["labels"], a["annotations"]) for a in raised]
