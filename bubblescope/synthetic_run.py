"""A synthetic data-parallel × pipeline-parallel training run, sent over the public HTTP API the way
the collector sends it: for the scale bench (``bench/scale.py``) and the 1,024-rank tests.

Layout: ``stages × replicas`` ranks, rank = replica × stages + stage (a replica's stages fill a
host of ``ranks_per_host``). Each replica's pipeline step is replayed by the analysis's own
simulator (``analysis.simulator.simulate``: GPipe, 1F1B, interleaved, ...), with ±2% noise per
(rank, step) and ``slow`` ranks computing a factor longer. Spans per rank and step: each forward and
backward, a pipeline recv before it (waiting for the peer) and a send after it, then the
data-parallel gradient all-reduce (which waits for the slowest replica of the stage) and the
optimizer. Like the collector's default, full spans are sent for every ``full_every``-th step and
step aggregates for every step.
"""

from __future__ import annotations

import concurrent.futures
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

import httpx

from bubblescope import wire
from bubblescope.analysis import BACKWARD, FORWARD, PipelineSetup, SimulationResult, StageCost, simulate

MS = 1_000_000
EPOCH_NS = 1_770_000_000_000_000_000
GZIP_JSON = {"Content-Type": "application/json", "Content-Encoding": "gzip"}


@dataclass(frozen=True)
class SyntheticJob:
    stages: int = 8
    replicas: int = 128
    microbatches: int = 16
    schedule: str = "Schedule1F1B"
    steps: int = 20
    full_every: int = 10
    forward_ms: float = 20.0
    backward_ms: float = 40.0
    p2p_ms: float = 1.0
    all_reduce_ms: float = 30.0
    optimizer_ms: float = 10.0
    ranks_per_host: int = 8
    slow: tuple[tuple[int, float], ...] = ()  # (rank, compute factor)
    start_ns: int = EPOCH_NS

    @property
    def world_size(self) -> int:
        return self.stages * self.replicas

    def stage_of(self, rank: int) -> int:
        return rank % self.stages

    def replica_of(self, rank: int) -> int:
        return rank // self.stages

    def host_of(self, rank: int) -> str:
        return f"node{rank // self.ranks_per_host:05d}"

    def config(self) -> dict[str, Any]:
        return {
            "schedule": self.schedule,
            "num_stages": self.stages,
            "num_microbatches": self.microbatches,
            "pp": self.stages,
            "dp": self.replicas,
        }

    def registration(self, rank: int) -> dict[str, Any]:
        return {
            "host": self.host_of(rank),
            "pid": 10_000 + rank,
            "stage": self.stage_of(rank),
            "coords": {"dp": self.replica_of(rank), "pp": self.stage_of(rank)},
            "clock_offset_ns": 0,
            "clock_uncertainty_ns": 0,
        }

    def has_spans(self, step: int) -> bool:
        return step % self.full_every == 0

    @cached_property
    def step_ns(self) -> int:
        """Every step lasts the same wall time here: the slowest rank's, plus a little slack."""
        ends = (row[3] for step in (0, 1) for rows in self.timeline(step).values() for row in rows)
        return int(max(ends) * 1.05) + MS

    def timeline(self, step: int) -> dict[int, list[tuple[Any, ...]]]:
        """Each rank's span rows of ``step``, start and end relative to the step's start."""
        return _timeline(self, step)

    def step_start(self, step: int) -> int:
        return self.start_ns + step * self.step_ns


@lru_cache(maxsize=4)
def _timeline(job: SyntheticJob, step: int) -> dict[int, list[tuple[Any, ...]]]:
    return _Step(job, step).spans_by_rank


class _Step:
    """One step of every rank: span rows (``wire.SPAN_FIELDS`` order, start/end relative to the step)."""

    def __init__(self, job: SyntheticJob, step: int) -> None:
        self.job, self.step = job, step
        pipeline_end: dict[int, float] = {}
        self.spans_by_rank: dict[int, list[tuple[Any, ...]]] = {}
        for replica in range(job.replicas):
            result = simulate(self._setup(replica))
            for stage_rank in range(job.stages):
                rank = replica * job.stages + stage_rank
                self.spans_by_rank[rank] = self._pipeline_spans(rank, result)
                pipeline_end[rank] = max(t.end_ns for t in result.timeline if t.rank == stage_rank)
        slowest_per_stage = [
            max(pipeline_end[r * job.stages + s] for r in range(job.replicas)) for s in range(job.stages)
        ]
        for rank, rows in self.spans_by_rank.items():
            stage = job.stage_of(rank)
            reduce_end = slowest_per_stage[stage] + job.all_reduce_ms * MS
            rows.append(
                _row(step, "all_reduce", pipeline_end[rank], reduce_end, stage, None, None, 2**26, "dp", "grads")
            )
            optimizer_end = reduce_end + job.optimizer_ms * MS * self._factor(rank)
            rows.append(_row(step, "optimizer", reduce_end, optimizer_end, stage, None, None, None, None, None))

    def _factor(self, rank: int) -> float:
        noise = random.Random(self.step * 1_000_003 + rank).uniform(0.98, 1.02)
        return noise * dict(self.job.slow).get(rank, 1.0)

    def _setup(self, replica: int) -> PipelineSetup:
        job = self.job
        costs = []
        for stage in range(job.stages):
            factor = self._factor(replica * job.stages + stage)
            costs.append(StageCost(job.forward_ms * MS * factor, job.backward_ms * MS * factor))
        return PipelineSetup(job.schedule, job.stages, job.microbatches, tuple(costs), p2p_ns=job.p2p_ms * MS)

    def _pipeline_spans(self, rank: int, result: SimulationResult) -> list[tuple[Any, ...]]:
        job, step = self.job, self.step
        stage_rank = job.stage_of(rank)
        rows: list[tuple[Any, ...]] = []
        free = 0.0
        for timed in (t for t in result.timeline if t.rank == stage_rank):
            action = timed.action
            forward = action.kind == FORWARD
            kind = "forward" if forward else "backward"
            needs_peer = (forward and action.stage > 0) or (action.kind == BACKWARD and action.stage < job.stages - 1)
            peer_stage = action.stage - 1 if forward else action.stage + 1
            peer = rank - stage_rank + peer_stage
            name = wire.P2P_FORWARD if forward else wire.P2P_BACKWARD
            if needs_peer:
                recv_start = min(free, timed.start_ns - job.p2p_ms * MS / 20)  # posted when free
                rows.append(
                    _row(
                        step,
                        "recv",
                        recv_start,
                        timed.start_ns,
                        action.stage,
                        action.microbatch,
                        peer,
                        2**20,
                        "pp",
                        name,
                    )
                )
            rows.append(
                _row(step, kind, timed.start_ns, timed.end_ns, action.stage, action.microbatch, None, None, None, None)
            )
            sends = (forward and action.stage < job.stages - 1) or (not forward and action.stage > 0)
            if sends:
                to = rank - stage_rank + (action.stage + 1 if forward else action.stage - 1)
                send_end = timed.end_ns + job.p2p_ms * MS / 4
                rows.append(
                    _row(step, "send", timed.end_ns, send_end, action.stage, action.microbatch, to, 2**20, "pp", name)
                )
            free = timed.end_ns
        return rows


def _row(step: int, kind: str, start: float, end: float, *rest: Any) -> tuple[Any, ...]:
    return (step, kind, int(start), int(end), *rest)


def aggregate(job: SyntheticJob, step: int, rows: list[tuple[Any, ...]]) -> dict[str, Any]:
    """The step aggregate the collector computes from a rank's spans (no overlap credited)."""
    start = job.step_start(step)
    compute = sum(r[3] - r[2] for r in rows if r[1] in wire.COMPUTE_KINDS)
    comm = sum(r[3] - r[2] for r in rows if r[1] in wire.COMMUNICATION_KINDS)
    window = job.step_ns
    return {
        "step": step,
        "start_ns": start,
        "end_ns": start + window,
        "compute_ns": compute,
        "comm_ns": comm,
        "exposed_comm_ns": min(comm, window - compute),
        "idle_ns": max(0, window - compute - comm),
        "span_count": len(rows),
    }


def batches(job: SyntheticJob, steps_per_batch: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """(rank, batch) in the order a job would send them: step by step, every rank per flush."""
    seqs = [0] * job.world_size
    for first in range(0, job.steps, steps_per_batch):
        chunk = range(first, min(job.steps, first + steps_per_batch))
        timelines = {step: job.timeline(step) for step in chunk}
        for rank in range(job.world_size):
            steps: list[dict[str, Any]] = []
            spans: list[tuple[Any, ...]] = []
            for step in chunk:
                rows = timelines[step][rank]
                offset = job.step_start(step)
                steps.append(aggregate(job, step, rows))
                if job.has_spans(step):
                    spans.extend((r[0], r[1], r[2] + offset, r[3] + offset, *r[4:]) for r in rows)
            batch = {
                "run_key": "",
                "rank": rank,
                "seq": seqs[rank],
                "dropped_spans": 0,
                "steps": steps,
                "spans": wire.spans_to_columns(spans),
            }
            seqs[rank] += 1
            yield rank, batch


def register_job(client: httpx.Client, job: SyntheticJob, run_key: str, senders: int) -> None:
    client.put(f"/api/v1/runs/{run_key}", json={"name": "scale", "world_size": job.world_size, "config": job.config()})

    def put(rank: int) -> None:
        client.put(f"/api/v1/runs/{run_key}/ranks/{rank}", json=job.registration(rank)).raise_for_status()

    with concurrent.futures.ThreadPoolExecutor(senders) as pool:
        list(pool.map(put, range(job.world_size)))


def send_job(
    client: httpx.Client, job: SyntheticJob, run_key: str, steps_per_batch: int, senders: int
) -> dict[str, float]:
    """Posts every batch from ``senders`` threads; returns the ingest figures."""
    latencies: list[float] = []
    spans = 0

    def post(body: bytes) -> None:
        began = time.perf_counter()
        response = client.post("/api/v1/ingest", content=body, headers=GZIP_JSON)
        latencies.append(time.perf_counter() - began)
        response.raise_for_status()

    bodies = []
    for _, batch in batches(job, steps_per_batch):
        batch["run_key"] = run_key
        spans += len(batch["spans"]["step"])
        bodies.append(wire.encode_batch(batch))
    began = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(senders) as pool:
        list(pool.map(post, bodies))
    elapsed = time.perf_counter() - began
    latencies.sort()
    return {
        "batches": len(bodies),
        "spans": spans,
        "seconds": elapsed,
        "wire_mb": sum(map(len, bodies)) / 1e6,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)],
    }


def end_job(client: httpx.Client, job: SyntheticJob, run_key: str, senders: int) -> None:
    """Every rank reports it finished, as the collector does on exit (else the run turns silent)."""
    end = {"outcome": "finished", "end_ns": job.step_start(job.steps)}

    def put(rank: int) -> None:
        client.put(f"/api/v1/runs/{run_key}/ranks/{rank}/end", json=end).raise_for_status()

    with concurrent.futures.ThreadPoolExecutor(senders) as pool:
        list(pool.map(put, range(job.world_size)))
