"""Can one service keep up with a big job's collectors? A synthetic run (``bench/synthetic_run.py``) of
``stages × replicas`` ranks, each rank sending what its collector would: every flush interval, a batch of
the steps it finished since (aggregates of every step, full spans of every 10th), for ``--seconds``.

The interval is the one the service answers (``flush_interval_s``: world_size / --ingest-batches-per-s,
at least 1 s), as the collector adopts it; ``--interval 1`` forces the collector's old fixed 1 s. Each
rank starts at a random point of its interval, so the load is even. Prints what was offered and
delivered, errors (any non-202), request latency (p50, p99, max), the service process's CPU in cores,
how far the senders fell behind their schedule, and, on PostgreSQL, the database's growth (bytes per
span stored, bytes per hour at this cadence).

    python bench/sustained_ingest.py [--db postgres] [--replicas 128] [--seconds 600] [--interval S]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import heapq
import random
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import psutil
from sqlalchemy import create_engine, text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.scale import service
from bench.synthetic_run import GZIP_JSON, SyntheticJob, aggregate, register_job
from bubblescope import wire

TEMPLATE_STEPS = 2  # steps are replayed from this many simulated ones (the load, not the shape, matters here)


def batch_for(job: SyntheticJob, run_key: str, rank: int, seq: int, steps: range) -> tuple[bytes, int]:
    aggregates, spans = [], []
    for step in steps:
        rows = [(step, *row[1:]) for row in job.timeline(step % TEMPLATE_STEPS)[rank]]
        aggregates.append(aggregate(job, step, rows))
        if job.has_spans(step):
            offset = job.step_start(step)
            spans.extend((r[0], r[1], r[2] + offset, r[3] + offset, *r[4:]) for r in rows)
    document = {"run_key": run_key, "rank": rank, "seq": seq, "dropped_spans": 0, "steps": aggregates}
    document["spans"] = wire.spans_to_columns(spans)
    return wire.encode_batch(document), len(spans)


def database_bytes(db_url: str) -> int | None:
    if not db_url.startswith("postgresql"):
        return None
    engine = create_engine(db_url)
    with engine.connect() as connection:
        size = int(connection.execute(text("SELECT pg_database_size(current_database())")).scalar_one())
    engine.dispose()
    return size


class Load:
    """The senders' figures, shared by the worker threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.statuses: dict[str, int] = {}
        self.spans = 0
        self.behind_s: list[float] = []

    def record(self, latency: float, status: str, spans: int, behind: float) -> None:
        with self.lock:
            self.latencies.append(latency)
            self.statuses[status] = self.statuses.get(status, 0) + 1
            self.spans += spans if status == "202" else 0
            self.behind_s.append(behind)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="postgres")
    parser.add_argument("--stages", type=int, default=8)
    parser.add_argument("--replicas", type=int, default=128)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--interval", type=float, default=None, help="force this flush interval (s)")
    parser.add_argument("--workers", type=int, default=64, help="concurrent connections of the senders")
    args = parser.parse_args()
    job = SyntheticJob(stages=args.stages, replicas=args.replicas, steps=TEMPLATE_STEPS)
    step_s = job.step_ns / 1e9
    run_key = f"sustain-{uuid.uuid4().hex[:8]}"
    with (
        service(args.db) as live,
        httpx.Client(base_url=live.url, timeout=60, limits=httpx.Limits(max_connections=args.workers)) as client,
    ):
        register_job(client, job, run_key, 8)
        body, _ = batch_for(job, run_key, 0, 0, range(1))
        answer = client.post("/api/v1/ingest", content=body, headers=GZIP_JSON).json()
        interval = args.interval or float(answer["flush_interval_s"])
        print(
            f"{job.world_size:,} ranks, steps of {step_s * 1000:.0f} ms, flush every {interval:.2f} s "
            f"({'forced' if args.interval else 'the service answer'}): {job.world_size / interval:.0f} batches/s "
            f"offered for {args.seconds:.0f} s; {args.db}"
        )
        server = psutil.Process(live.process.pid)
        size_before = database_bytes(live.db_url)
        load = Load()
        noise = random.Random(1)
        start = time.monotonic() + 1.0
        due = [(start + noise.uniform(0, interval), rank) for rank in range(job.world_size)]
        heapq.heapify(due)
        sent_through = dict.fromkeys(range(job.world_size), 0)  # step 0 went with the probe (rank 0) or not at all
        seqs = dict.fromkeys(range(job.world_size), 1)
        cpu_before = sum(server.cpu_times()[:2])

        def send(rank: int, steps: range, seq: int, at: float) -> None:
            body, spans = batch_for(job, run_key, rank, seq, steps)
            began = time.monotonic()
            try:
                status = str(client.post("/api/v1/ingest", content=body, headers=GZIP_JSON).status_code)
            except httpx.HTTPError as error:
                status = type(error).__name__
            load.record(time.monotonic() - began, status, spans, began - at)

        with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
            while due and due[0][0] < start + args.seconds:
                at, rank = heapq.heappop(due)
                time.sleep(max(0.0, at - time.monotonic()))
                finished = int((at - start) / step_s)
                if finished > sent_through[rank]:
                    pool.submit(send, rank, range(sent_through[rank] + 1, finished + 1), seqs[rank], at)
                    sent_through[rank], seqs[rank] = finished, seqs[rank] + 1
                heapq.heappush(due, (at + interval, rank))
        wall = time.monotonic() - start
        cpu = sum(server.cpu_times()[:2]) - cpu_before
        size_after = database_bytes(live.db_url)
    report(load, wall, cpu, size_before, size_after)


def report(load: Load, wall: float, cpu: float, size_before: int | None, size_after: int | None) -> None:
    latencies = sorted(load.latencies)
    count = len(latencies)
    delivered = load.statuses.get("202", 0)
    errors = {status: n for status, n in load.statuses.items() if status != "202"}

    def at(q: float) -> float:
        return 1000 * latencies[min(count - 1, int(q * count))]

    print(
        f"sent {count:,} batches in {wall:.0f} s ({count / wall:.0f}/s), delivered {delivered:,}, errors {errors or 0}; "
        f"{load.spans:,} spans stored"
    )
    print(f"latency ms: p50 {at(0.5):.0f}, p99 {at(0.99):.0f}, max {1000 * latencies[-1]:.0f}")
    print(f"service CPU: {cpu / wall:.2f} cores; senders behind schedule: max {max(load.behind_s):.2f} s")
    if size_before is not None and size_after is not None:
        grown = size_after - size_before
        print(
            f"database grew {grown / 1e6:.1f} MB: {grown / max(1, load.spans):.0f} bytes per span stored "
            f"(aggregates included), {grown / wall * 3600 / 1e9:.2f} GB per hour at this cadence"
        )


if __name__ == "__main__":
    main()
