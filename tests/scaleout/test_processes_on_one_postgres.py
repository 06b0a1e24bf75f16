"""Three ``serve`` processes on one PostgreSQL database: batches sent to any of them, retries included
(the same batch to two processes at once), are each stored exactly once; one process leads the
background work (alert rules, deliveries, retention), and when it dies another takes over."""

from __future__ import annotations

import concurrent.futures
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import (
    LiveServer,
    count_rows,
    ingest_batch,
    migrated_database,
    post_gzip,
    register,
    start_server,
    wait_until,
)

pytestmark = pytest.mark.postgres
PROCESSES = 3
SERVE = ["--alert-interval", "1"]


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[LiveServer]]:
    with migrated_database("postgres", tmp_path) as url:
        started = [start_server(url, tmp_path, extra_args=SERVE) for _ in range(PROCESSES)]
        try:
            yield started
        finally:
            for live in started:
                live.stop()


def roles(servers: list[LiveServer]) -> list[str]:
    out = []
    for live in servers:
        try:
            out.append(httpx.get(f"{live.url}/api/v1/health", timeout=5).json()["background"])
        except httpx.HTTPError:
            out.append("down")
    return out


def test_batches_through_any_process_are_stored_once(servers: list[LiveServer]) -> None:
    with servers[0].client() as client:
        key = register(client, world_size=4)
    sends = [(rank, seq) for rank in range(4) for seq in range(30)]

    def post(item: tuple[int, tuple[int, int]]) -> int:
        index, (rank, seq) = item
        with servers[index % PROCESSES].client() as client:
            return post_gzip(client, ingest_batch(key, seq=seq, rank=rank, step=seq)).status_code

    twice = [*enumerate(sends), *enumerate(sends, start=1)]  # every batch twice, through two processes
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(post, twice))
    assert set(statuses) == {202}
    assert count_rows(servers[0].db_url, "ingested_batches", key) == len(sends)
    assert count_rows(servers[0].db_url, "spans", key) == 5 * len(sends)
    assert count_rows(servers[0].db_url, "steps", key) == len(sends)


def test_one_process_leads_the_background_work_and_another_takes_over_when_it_dies(
    servers: list[LiveServer],
) -> None:
    wait_until(lambda: roles(servers).count("leader") == 1, 20, "one leader", interval_s=0.2)
    assert roles(servers).count("standby") == PROCESSES - 1
    leader = servers[roles(servers).index("leader")]
    leader.process.send_signal(signal.SIGKILL)  # no goodbye: its connection, and the lock, die with it
    leader.process.wait(10)
    rest = [live for live in servers if live is not leader]
    wait_until(lambda: roles(rest).count("leader") == 1, 30, "a new leader", interval_s=0.2)
