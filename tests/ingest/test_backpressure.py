"""Backpressure: past ``--ingest-in-flight`` requests at work and ``--ingest-queue`` waiting, the
service answers 503 with Retry-After at once (the sender keeps its batch and retries) instead of
queueing them without bound, and reads keep answering
while ingest is saturated. Real uvicorn process, real SQLite; figures in bench/hostile.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bubblescope.backend.db import migrate
from tests.support import LiveServer, count_rows, gzip_json, ingest_batch, register, start_server

SENDERS = 8
BATCHES_PER_SENDER = 6
SPANS = 4000


@pytest.fixture
def narrow_server(tmp_path: Path) -> Iterator[LiveServer]:
    url = f"sqlite:///{tmp_path / 'bubblescope.db'}"
    migrate.upgrade(url)
    live = start_server(
        url, tmp_path, extra_args=["--ingest-in-flight", "2", "--ingest-queue", "2", "--retry-after", "1"]
    )
    yield live
    live.stop()


def test_ingest_past_its_limit_is_told_to_retry_and_reads_keep_answering(narrow_server: LiveServer) -> None:
    with narrow_server.client() as client:
        key = register(client, world_size=SENDERS)
    busy: list[str] = []
    read_seconds: list[float] = []
    done = threading.Event()

    def send(rank: int) -> None:
        with narrow_server.client() as client:
            for seq in range(BATCHES_PER_SENDER):
                body = gzip_json(ingest_batch(key, seq=seq, spans=SPANS, rank=rank))
                while True:
                    response = client.post(
                        "/api/v1/ingest",
                        content=body,
                        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
                    )
                    if response.status_code == 202:
                        break
                    assert response.status_code == 503, response.text
                    assert response.headers["retry-after"] == "1"
                    busy.append(response.json()["detail"][0]["type"])
                    time.sleep(0.05)

    failed_reads: list[str] = []

    def read() -> None:
        with narrow_server.client() as client:
            while not done.is_set():
                started = time.monotonic()
                for path in ("/api/v1/runs", "/api/v1/health"):
                    response = client.get(path)
                    if response.status_code != 200:
                        failed_reads.append(f"{path}: {response.status_code} {response.text[:200]}")
                read_seconds.append(time.monotonic() - started)
                time.sleep(0.05)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    senders = [threading.Thread(target=send, args=(rank,), daemon=True) for rank in range(SENDERS)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(180)
    done.set()
    reader.join(30)
    assert not any(sender.is_alive() for sender in senders), "senders did not finish"
    assert busy and set(busy) == {"busy"}, f"{len(busy)} busy answers: the gate never closed"
    assert read_seconds, "no read completed during the load"
    assert failed_reads == [], failed_reads
    # A generous bound that holds on a loaded machine; bench/hostile.py reports the real latencies.
    assert max(read_seconds) < 10, f"reads took up to {max(read_seconds):.1f} s under ingest load"
    assert count_rows(narrow_server.db_url, "ingested_batches", key) == SENDERS * BATCHES_PER_SENDER
    assert count_rows(narrow_server.db_url, "spans", key) == SENDERS * BATCHES_PER_SENDER * SPANS
