"""Spans per second accepted end to end (HTTP -> database) by one server process.

Batches are built exactly as the collector ships them (column-wise, gzip JSON) and pre-encoded,
then posted by a separate client process with a few concurrent connections, so the figure is
the server's. Runs against SQLite always and PostgreSQL when reachable.

    python bench/ingest.py [--batches 40] [--spans-per-batch 20000]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bubblescope import wire
from bubblescope.backend.db import migrate
from tests.support import (
    create_postgres_database,
    drop_postgres_database,
    postgres_unreachable_reason,
    start_server,
)

KINDS = ["forward", "backward", "send", "recv"]

GZIP_JSON = {"Content-Type": "application/json", "Content-Encoding": "gzip"}


def make_batch(run_key: str, rank: int, seq: int, spans: int) -> bytes:
    base = 1_760_000_000_000_000_000 + seq * 10**9
    rows = [
        (
            seq,
            KINDS[i % 4],
            base + i * 1000,
            base + i * 1000 + 700,
            rank,
            i % 16,
            rank + 1 if KINDS[i % 4] in ("send", "recv") else None,
            4096,
            "pp",
            "fwd",
        )
        for i in range(spans)
    ]
    return wire.encode_batch(
        {
            "run_key": run_key,
            "rank": rank,
            "seq": seq,
            "dropped_spans": 0,
            "steps": [
                {
                    "step": seq,
                    "start_ns": base,
                    "end_ns": base + spans * 1000,
                    "compute_ns": spans * 350,
                    "comm_ns": spans * 350,
                    "exposed_comm_ns": spans * 350,
                    "idle_ns": 0,
                    "span_count": spans,
                }
            ],
            "spans": wire.spans_to_columns(rows),
        }
    )


def measure(db_url: str, label: str, batches: int, spans_per_batch: int, workers: int) -> float:
    server = start_server(db_url, Path(tempfile.mkdtemp()))
    try:
        run_key = f"bench-{int(time.time())}"
        with httpx.Client(base_url=server.url, timeout=120) as client:
            client.put(f"/api/v1/runs/{run_key}", json={"name": "bench", "world_size": workers}).raise_for_status()
            payloads = [(i % workers, make_batch(run_key, i % workers, i, spans_per_batch)) for i in range(batches)]
            client.post(
                "/api/v1/ingest", content=make_batch(run_key, 0, 10**6, 100), headers=GZIP_JSON
            ).raise_for_status()  # warm-up

            def post(item: tuple[int, bytes]) -> None:
                response = client.post("/api/v1/ingest", content=item[1], headers=GZIP_JSON)
                response.raise_for_status()

            started = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(workers) as pool:
                list(pool.map(post, payloads))
            elapsed = time.perf_counter() - started
        rate = batches * spans_per_batch / elapsed
        mb = sum(len(p) for _, p in payloads) / 1e6
        print(
            f"{label:10s} {batches * spans_per_batch:>9,d} spans in {elapsed:6.2f} s = {rate:>10,.0f} spans/s "
            f"({mb:.1f} MB gzip on the wire, {spans_per_batch} spans/batch, {workers} connections)"
        )
        return rate
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--spans-per-batch", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    sqlite_url = f"sqlite:///{tempfile.mkdtemp()}/bench.db"
    migrate.upgrade(sqlite_url)
    measure(sqlite_url, "sqlite", args.batches, args.spans_per_batch, args.workers)
    reason = postgres_unreachable_reason()
    if reason:
        print(f"postgres   skipped: {reason}")
        return
    pg_url, name = create_postgres_database()
    try:
        migrate.upgrade(pg_url)
        measure(pg_url, "postgres", args.batches, args.spans_per_batch, args.workers)
    finally:
        drop_postgres_database(name)


if __name__ == "__main__":
    main()
