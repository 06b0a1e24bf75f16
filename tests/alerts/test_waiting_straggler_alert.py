"""The straggler alert pages on the rank that holds the step: two two-rank DDP runs fed through the API
(tests/dashboard/test_waiting_straggler.py), each with rank 0 computing 1.19× rank 1. Where rank 1 is on time
and waits for rank 0, the service's rules fire BubblescopeStraggler on rank 0; where rank 1 spends 100 ms a step on
the host and rank 0 waits for it, rank 0's extra compute holds nothing and nobody is paged for it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.alerts.fault_jobs import alerts, wait_for
from tests.analysis.test_waiting_straggler import HOST_WORK
from tests.dashboard.test_waiting_straggler import feed
from tests.support import LiveServer, migrated_database, start_server

pytestmark = [pytest.mark.slow, pytest.mark.timing]
RULES_EVERY_S = 1


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """Rules every second; a run fed once stays running (not hung) for the test's length."""
    with migrated_database("sqlite", tmp_path_factory.mktemp("db")) as url:
        args = ["--alert-interval", str(RULES_EVERY_S), "--hung-after", "600", "--silent-after", "600"]
        live = start_server(url, tmp_path_factory.mktemp("server"), extra_args=args)
        yield live
        live.stop()


def test_the_straggler_alert_names_the_rank_the_others_wait_for_only(service: LiveServer) -> None:
    with service.client() as client:
        waiting = feed(client, HOST_WORK)
        holding = feed(client, 0)
        fired = wait_for(client, holding, "BubblescopeStraggler", "firing", timeout_s=60)
        assert fired["labels"]["rank"] == "0" and fired["labels"]["host"] == "host0", fired
        time.sleep(3 * RULES_EVERY_S)  # the waiting run, fed first, has been through the rules as often
        paged = [a for a in alerts(client, waiting) if a["labels"]["alertname"] == "BubblescopeStraggler"]
        assert paged == [], paged
        findings = client.get(f"/api/v1/runs/{waiting}/stragglers").json()["findings"]
        assert findings[0]["ranks"] == [0] and findings[0]["verdict"] == "persistent", findings  # seen, not paged
