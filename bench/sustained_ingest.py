"""Can one service keep up with a big job's collectors? A synthetic run (``bubblescope/synthetic_run.py``) of
``stages × replicas`` ranks, each rank sending what its collector would: every flush interval, a batch of
the steps it finished since (aggregates of every step, full spans of every 10th), for ``--seconds``.

The interval is the one the service answers (``flush_interval_s``: world_size / --ingest-batches-per-s,
at least 1 s), as the collector adopts it; ``--interval 1`` forces the collector's old fixed 1 s. Each
rank starts at a random point of its interval, so the load is even. Every batch is built (in worker
processes) before the clock starts: on a 2-core machine, senders building them as they go took as
much CPU as the service. Prints what was offered and delivered, errors (any non-202), request
latency (p50, p99, max), the service's CPU in cores (its figure worker included), the senders' and the whole machine's,
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

from bench.scale import services
from bubblescope import wire
from bubblescope.synthetic_run import GZIP_JSON, SyntheticJob, aggregate, register_job

SLOW_S = 0.2  # the p99 goal
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


def schedule(world_size: int, interval: float, step_s: float, seconds: float) -> list[tuple[float, int, int, range]]:
    """(seconds from the start, rank, seq, steps) of every batch the job's ranks send in ``seconds``: each
    rank every ``interval`` from a random point of its first, with the steps it finished since its last."""
    noise = random.Random(1)
    due = [(noise.uniform(0, interval), rank) for rank in range(world_size)]
    heapq.heapify(due)
    sent_through = dict.fromkeys(range(world_size), 0)  # step 0 went with the probe (rank 0) or not at all
    seqs = dict.fromkeys(range(world_size), 1)
    plan = []
    while due and due[0][0] < seconds:
        at, rank = heapq.heappop(due)
        finished = int(at / step_s)
        if finished > sent_through[rank]:
            plan.append((at, rank, seqs[rank], range(sent_through[rank] + 1, finished + 1)))
            sent_through[rank], seqs[rank] = finished, seqs[rank] + 1
        heapq.heappush(due, (at + interval, rank))
    return plan


def _build(args: tuple[SyntheticJob, str, int, int, range]) -> tuple[bytes, int]:
    return batch_for(*args)


def process_tree_cpu(process: psutil.Process) -> float:
    """CPU seconds of the service and its children (the alert rules' figure worker)."""
    tree = [process, *process.children(recursive=True)]
    return sum(sum(member.cpu_times()[:2]) for member in tree)


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
        self.slow_at_s: list[float] = []  # when (s from the start) the requests slower than SLOW_S were sent
        self.statuses: dict[str, int] = {}
        self.spans = 0
        self.behind_s: list[float] = []

    def record(self, latency: float, status: str, spans: int, behind: float, at_s: float) -> None:
        with self.lock:
            if latency > SLOW_S:
                self.slow_at_s.append(at_s)
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
    parser.add_argument(
        "--processes", type=int, default=1, help="serve processes on the one database; rank r sends to r %% N"
    )
    args = parser.parse_args()
    job = SyntheticJob(stages=args.stages, replicas=args.replicas, steps=TEMPLATE_STEPS)
    step_s = job.step_ns / 1e9
    run_key = f"sustain-{uuid.uuid4().hex[:8]}"
    with services(args.db, args.processes) as lives:
        live = lives[0]
        limits = httpx.Limits(max_connections=max(1, args.workers // len(lives)))
        clients = [httpx.Client(base_url=each.url, timeout=60, limits=limits) for each in lives]
        client = clients[0]
        register_job(client, job, run_key, 8)
        body, _ = batch_for(job, run_key, 0, 0, range(1))
        answer = client.post("/api/v1/ingest", content=body, headers=GZIP_JSON).json()
        interval = args.interval or float(answer["flush_interval_s"])
        print(
            f"{job.world_size:,} ranks, steps of {step_s * 1000:.0f} ms, flush every {interval:.2f} s "
            f"({'forced' if args.interval else 'the service answer'}): {job.world_size / interval:.0f} batches/s "
            f"offered for {args.seconds:.0f} s; {args.db}"
        )
        plan = schedule(job.world_size, interval, step_s, args.seconds)
        print(f"building {len(plan):,} batches before the clock starts (the senders' CPU is not the service's)")
        with concurrent.futures.ProcessPoolExecutor() as builders:
            bodies = list(builders.map(_build, ((job, run_key, *sent[1:]) for sent in plan), chunksize=256))
        servers = [psutil.Process(each.process.pid) for each in lives]
        size_before = database_bytes(live.db_url)
        load = Load()

        def send(body: bytes, spans: int, at: float, rank: int) -> None:  # rank r to process r % N, as a balancer
            began = time.monotonic()
            try:
                answer = clients[rank % len(clients)].post("/api/v1/ingest", content=body, headers=GZIP_JSON)
                status = str(answer.status_code)
            except httpx.HTTPError as error:
                status = type(error).__name__
            load.record(time.monotonic() - began, status, spans, began - at, began - start)

        cpu_before = sum(process_tree_cpu(server) for server in servers)
        own_before = sum(psutil.Process().cpu_times()[:4])
        machine_before = psutil.cpu_times()
        start = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
            for (offset, rank, *_), (body, spans) in zip(plan, bodies):
                time.sleep(max(0.0, start + offset - time.monotonic()))
                pool.submit(send, body, spans, start + offset, rank)
        wall = time.monotonic() - start
        cpu = sum(process_tree_cpu(server) for server in servers) - cpu_before
        senders_cpu = sum(psutil.Process().cpu_times()[:4]) - own_before
        machine_after = psutil.cpu_times()
        machine_cpu = machine_after.user + machine_after.system - machine_before.user - machine_before.system
        size_after = database_bytes(live.db_url)
        for each in clients:
            each.close()
    report(load, wall, cpu, size_before, size_after)
    print(
        f"senders {senders_cpu / wall:.2f} cores (batches built beforehand); "
        f"machine busy {machine_cpu / wall:.2f} of {psutil.cpu_count()} cores"
    )


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
    bursts = sorted({int(t // 10) * 10 for t in load.slow_at_s})
    print(
        f"{len(load.slow_at_s):,} requests over {SLOW_S * 1000:.0f} ms, sent in the 10-s windows starting at {bursts} s"
    )
    print(f"service CPU: {cpu / wall:.2f} cores; senders behind schedule: max {max(load.behind_s):.2f} s")
    if size_before is not None and size_after is not None:
        grown = size_after - size_before
        print(
            f"database grew {grown / 1e6:.1f} MB: {grown / max(1, load.spans):.0f} bytes per span stored "
            f"(aggregates included), {grown / wall * 3600 / 1e9:.2f} GB per hour at this cadence"
        )


if __name__ == "__main__":
    main()
