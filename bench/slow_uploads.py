"""Slow uploads against everyone else's ingest: a real ``serve`` (SQLite, default limits: 4 ingest requests
in work, 64 waiting, 30-s body timeout), N connections each sending an ingest body one byte every 5 s (the
probe's attack), and one well-behaved client sending batches back to back for ``--seconds``. Per N: the
client's batches stored (202) and refused (503), and its latency (median, max).

    python bench/slow_uploads.py [--senders 0,4,68] [--seconds 10]

Figures in docs/benchmarks.md (before and after the ingest slot moved behind the body).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bubblescope.backend.db import migrate
from tests.support import LiveServer, ingest_batch, post_gzip, register, start_server

DRIP_EVERY_S = 5.0


def drip(live: LiveServer, stop: threading.Event) -> None:
    """One slow sender: headers, then a byte every ``DRIP_EVERY_S`` until ``stop`` (or the server hangs up)."""
    url = httpx.URL(live.url)
    with socket.create_connection((url.host, url.port)) as connection:
        head = (
            f"POST /api/v1/ingest HTTP/1.1\r\nHost: {url.host}:{url.port}\r\nContent-Type: application/json\r\n"
            "Content-Length: 100000\r\n\r\n"
        )
        connection.sendall(head.encode())
        while not stop.wait(DRIP_EVERY_S):
            try:
                connection.sendall(b" ")
            except OSError:
                return


def measure(live: LiveServer, senders: int, seconds: float) -> tuple[int, int, list[float]]:
    stop = threading.Event()
    threads = [threading.Thread(target=drip, args=(live, stop), daemon=True) for _ in range(senders)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # every sender is mid-body
    stored = refused = 0
    latencies: list[float] = []
    with live.client() as client:
        key = register(client, world_size=1)
        deadline = time.monotonic() + seconds
        seq = 0
        while time.monotonic() < deadline:
            started = time.monotonic()
            answer = post_gzip(client, ingest_batch(key, seq=seq, step=seq))
            latencies.append(time.monotonic() - started)
            if answer.status_code == 202:
                stored += 1
                seq += 1
            elif answer.status_code == 503:
                refused += 1
                time.sleep(0.1)
            else:
                raise RuntimeError(f"{answer.status_code}: {answer.text[:200]}")
    stop.set()
    return stored, refused, latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--senders", default="0,4,68", help="slow senders per round, comma-separated")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the client sends per round")
    args = parser.parse_args()
    print(f"{'slow senders':>12} {'stored':>7} {'503':>5} {'median ms':>10} {'max ms':>9}")
    for senders in (int(n) for n in args.senders.split(",")):
        with tempfile.TemporaryDirectory() as folder:
            url = f"sqlite:///{Path(folder) / 'bubblescope.db'}"
            migrate.upgrade(url)
            live = start_server(url, Path(folder))
            try:
                stored, refused, latencies = measure(live, senders, args.seconds)
            finally:
                live.stop()
        print(
            f"{senders:>12} {stored:>7} {refused:>5} {1000 * statistics.median(latencies):>10.1f} "
            f"{1000 * max(latencies):>9.1f}"
        )


if __name__ == "__main__":
    main()
