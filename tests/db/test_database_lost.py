"""The database goes away under a running service and comes back: the service says so (503 in the
API's error shape, with Retry-After; readiness failing; liveness naming the database), recovers
without a restart, and loses nothing it acknowledged. Real PostgreSQL, real uvicorn process."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from bubblescope.backend.auth.scopes import Scope
from bubblescope.backend.db import migrate
from tests.auth.support import bearer, make_token
from tests.collector.jobs import launch, read_report
from tests.support import (
    PG_ADMIN_DSN,
    LiveServer,
    count_rows,
    create_postgres_database,
    drop_postgres_database,
    gzip_json,
    ingest_batch,
    postgres_unreachable_reason,
    register,
    run_rows,
    start_server,
    wait_until,
)

pytestmark = pytest.mark.postgres
BATCHES = 60
SPANS_PER_BATCH = 50


@pytest.fixture
def pg_service(tmp_path: Path) -> Iterator[tuple[LiveServer, str]]:
    reason = postgres_unreachable_reason()
    if reason:
        pytest.skip(reason)
    url, name = create_postgres_database()
    migrate.upgrade(url)
    live = start_server(url, tmp_path, extra_args=["--retry-after", "1"])
    try:
        yield live, name
    finally:
        live.stop()
        _admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        drop_postgres_database(name)


def _admin(sql: str) -> None:
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as connection:
        connection.execute(sql)


def _cut_off(name: str) -> None:
    """The database refuses new connections and its open ones are killed: unreachable, data kept."""
    _admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
    _admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'")


def _assert_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == "1"
    (error,) = response.json()["detail"]
    assert error["type"] == "database_unavailable" and "retry" in error["msg"], error


class Sender(threading.Thread):
    """Sends BATCHES batches one after another, each until acknowledged, as the collector does."""

    def __init__(self, live: LiveServer, key: str) -> None:
        super().__init__(daemon=True)
        self.live, self.key = live, key
        self.acknowledged: list[int] = []
        self.statuses: list[int] = []

    def run(self) -> None:
        with self.live.client() as client:
            for seq in range(BATCHES):
                body = gzip_json(ingest_batch(self.key, seq=seq, spans=SPANS_PER_BATCH))
                while True:
                    try:
                        response = client.post(
                            "/api/v1/ingest",
                            content=body,
                            headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
                        )
                    except httpx.HTTPError:
                        time.sleep(0.1)
                        continue
                    self.statuses.append(response.status_code)
                    if response.status_code == 202:
                        self.acknowledged.append(seq)
                        break
                    assert response.status_code == 503, response.text
                    time.sleep(float(response.headers.get("retry-after", "1")) / 5)
                time.sleep(0.05)


def test_unreachable_database_is_reported_and_recovered_without_loss(pg_service: tuple[LiveServer, str]) -> None:
    live, name = pg_service
    with live.client() as client:
        key = register(client, world_size=1)
        sender = Sender(live, key)
        sender.start()
        wait_until(lambda: len(sender.acknowledged) >= 5, 30, "the first batches")
        _cut_off(name)
        wait_until(lambda: client.get("/api/v1/ready").status_code == 503, 30, "readiness to fail")
        _assert_unavailable(client.get("/api/v1/ready"))
        _assert_unavailable(client.get("/api/v1/runs"))
        _assert_unavailable(client.get(f"/api/v1/runs/{key}"))
        _assert_unavailable(client.put(f"/api/v1/runs/{key}", json={"name": "renamed", "world_size": 1}))
        health = client.get("/api/v1/health")
        assert health.status_code == 200 and health.json()["database"] == "unavailable", health.text
        assert health.json()["database_error"], health.text
        stalled = len(sender.acknowledged)
        time.sleep(1.5)
        assert len(sender.acknowledged) == stalled, "a batch was acknowledged while the database was away"

        _admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        wait_until(lambda: client.get("/api/v1/ready").status_code == 200, 30, "readiness to pass again")
        sender.join(120)
        assert not sender.is_alive(), "the sender did not finish after the database came back"
        assert client.get("/api/v1/health").json()["database"] == "ok"
        assert client.get(f"/api/v1/runs/{key}").json()["name"] == "ingest-test"  # the 503'd rename stored nothing
    assert 503 in sender.statuses, "the sender never met the outage: the test did not test it"
    assert sender.acknowledged == list(range(BATCHES))
    assert count_rows(live.db_url, "ingested_batches", key) == BATCHES
    assert count_rows(live.db_url, "spans", key) == BATCHES * SPANS_PER_BATCH


def test_dropped_database_gives_503_and_a_recreated_one_is_served_without_restart(
    pg_service: tuple[LiveServer, str],
) -> None:
    live, name = pg_service
    with live.client() as client:
        register(client, world_size=1)
        drop_postgres_database(name)
        wait_until(lambda: client.get("/api/v1/ready").status_code == 503, 30, "readiness to fail")
        _assert_unavailable(client.get("/api/v1/runs"))
        (error,) = client.get("/api/v1/runs").json()["detail"]
        assert "does not exist" in error["msg"], error

        _admin(f'CREATE DATABASE "{name}"')
        not_migrated = client.get("/api/v1/ready")
        assert not_migrated.status_code == 503, not_migrated.text
        assert not_migrated.json()["detail"][0]["type"] in ("schema_out_of_date", "database_unavailable")
        migrate.upgrade(live.db_url)
        wait_until(lambda: client.get("/api/v1/ready").status_code == 200, 30, "readiness on the new database")
        key = register(client, world_size=1)
        assert client.get(f"/api/v1/runs/{key}").status_code == 200


def test_collector_spools_through_the_outage_and_delivers_everything(
    pg_service: tuple[LiveServer, str], tmp_path: Path
) -> None:
    """A real collector (the hand-written loop, its own process) told 503 + Retry-After spools and
    comes back when told: every step reaches the database once it returns, nothing dropped."""
    live, name = pg_service
    run_key, switch, steps = "lost-db-collector", tmp_path / "switch", 300
    process, _report = launch(
        tmp_path,
        live.url,
        run_key,
        f"--steps={steps}",
        "--sleep-s=0.01",
        "--signal-at=60",
        f"--signal-file={switch}",
        env={"BUBBLESCOPE_FLUSH_INTERVAL_S": "0.2"},
    )
    wait_until(switch.exists, 120, "the loop to reach the outage")
    _cut_off(name)
    time.sleep(1.5)
    _admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    report = read_report(tmp_path, run_key, process)
    log = (tmp_path / f"{run_key}.log").read_text()
    assert "service busy (503)" in log, log[-2000:]
    assert report.dropped_spans == 0, report.figures()
    stored_steps = run_rows(live.db_url, run_key, "SELECT count(DISTINCT step) FROM steps WHERE run_id = {run}")
    assert stored_steps[0][0] == steps, log[-2000:]


def test_with_auth_the_databases_words_go_only_to_a_caller_with_a_token(tmp_path: Path) -> None:
    """The probe's finding: /ready is public and answered with the database's host and port when it was down.
    With --auth, a caller without a token learns it is unavailable; one with a token, why."""
    reason = postgres_unreachable_reason()
    if reason:
        pytest.skip(reason)
    url, name = create_postgres_database()
    migrate.upgrade(url)
    token = make_token(url, Scope.READ)
    live = start_server(url, tmp_path, extra_args=["--retry-after", "1", "--auth"])
    try:
        with live.client() as client:
            assert client.get("/api/v1/runs", headers=bearer(token)).status_code == 200  # now known to the service
            _cut_off(name)
            wait_until(lambda: client.get("/api/v1/ready").status_code == 503, 30, "readiness to fail")
            for anonymous in (
                client.get("/api/v1/ready"),
                client.post("/api/v1/session", json={"token": "bs_" + "x" * 40}),
            ):
                _assert_unavailable(anonymous)
                assert "5432" not in anonymous.text and "send a token to see why" in anonymous.text, anonymous.text
            health = client.get("/api/v1/health").json()
            assert health["database"] == "unavailable" and "5432" not in str(health["database_error"]), health
            assert health["database_error"].startswith("withheld")
            known = client.get("/api/v1/ready", headers=bearer(token))
            _assert_unavailable(known)
            assert "5432" in known.text, known.text
            assert "5432" in client.get("/api/v1/health", headers=bearer(token)).json()["database_error"]
    finally:
        live.stop()
        _admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        drop_postgres_database(name)
