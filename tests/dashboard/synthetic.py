"""A synthetic GPipe run registered and fed through the API, for pages that need a run of a given size fast."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from tests.support import post_gzip

BASE_NS = 1_700_000_000_000_000_000
FORWARD_NS = 2_000_000
BACKWARD_NS = 4_000_000
SEND_NS = 100_000
OPTIMIZER_NS = 500_000


def register_run(
    client: httpx.Client,
    key: str,
    stages: int,
    microbatches: int,
    name: str = "synthetic-gpipe",
    layers_per_stage: list[int] | None = None,
) -> None:
    """The run and one rank per stage, as a job's collector registers them."""
    config: dict[str, Any] = {"schedule": "ScheduleGPipe", "num_stages": stages, "num_microbatches": microbatches}
    if layers_per_stage is not None:
        config["layers_per_stage"] = layers_per_stage
    response = client.put(f"/api/v1/runs/{key}", json={"name": name, "world_size": stages, "config": config})
    assert response.status_code == 200, response.text
    for rank in range(stages):
        response = client.put(
            f"/api/v1/runs/{key}/ranks/{rank}", json={"host": f"node{rank // 8}", "pid": rank, "stage": rank}
        )
        assert response.status_code == 200, response.text


def gpipe_batch(
    key: str, rank: int, stages: int, microbatches: int, steps: range, slow: float = 1.0, jitter: float = 0.0
) -> dict[str, Any]:
    """One rank's batch for ``steps``: every forward, then every backward, an activation send after
    each forward but the last stage's; ``slow`` stretches this rank's compute; ``jitter`` shortens each action
    by 0, 1/4, 2/4 or 3/4 of that fraction, by step and micro-batch (each keeps its start: nothing overlaps)."""
    forward, backward = int(FORWARD_NS * slow), int(BACKWARD_NS * slow)
    span_rows: list[tuple[Any, ...]] = []
    aggregates = []
    for step in steps:
        start = BASE_NS + step * 1_000_000_000
        back_from = start + (microbatches + stages - 1) * FORWARD_NS
        rows = []
        for m in range(microbatches):
            shorter = 1 - jitter * ((3 * step + m) % 4) / 4
            f0 = start + rank * FORWARD_NS + m * forward
            rows.append((step, "forward", f0, f0 + int(forward * shorter), rank, m, None, None))
            if rank < stages - 1:
                rows.append((step, "send", f0 + forward, f0 + forward + SEND_NS, None, m, rank + 1, 1 << 20))
            b0 = back_from + (stages - 1 - rank) * BACKWARD_NS + m * backward
            rows.append((step, "backward", b0, b0 + int(backward * shorter), rank, m, None, None))
        optimizer = max(row[3] for row in rows)
        end = optimizer + OPTIMIZER_NS
        rows.append((step, "optimizer", optimizer, end, None, None, None, None))
        compute = sum(r[3] - r[2] for r in rows if r[1] != "send")
        comm = sum(r[3] - r[2] for r in rows if r[1] == "send")
        aggregates.append(
            {
                "step": step,
                "start_ns": start,
                "end_ns": end,
                "compute_ns": compute,
                "comm_ns": comm,
                "exposed_comm_ns": comm,
                "idle_ns": max(end - start - compute - comm, 0),
                "span_count": len(rows),
            }
        )
        span_rows += rows
    columns = ("step", "kind", "start_ns", "end_ns", "stage", "microbatch", "peer", "bytes")
    spans = {name: [row[i] for row in span_rows] for i, name in enumerate(columns)}
    return {"run_key": key, "rank": rank, "seq": steps.start, "steps": aggregates, "spans": spans}


def ingest_steps(
    client: httpx.Client,
    key: str,
    stages: int,
    microbatches: int,
    steps: range,
    slow: dict[int, float] | None = None,
    jitter: float = 0.0,
) -> None:
    for rank in range(stages):
        batch = gpipe_batch(key, rank, stages, microbatches, steps, (slow or {}).get(rank, 1.0), jitter)
        response = post_gzip(client, batch)
        assert response.is_success, response.text


def synthetic_run(client: httpx.Client, stages: int, microbatches: int, steps: int, **kwargs: Any) -> str:
    key = f"synthetic-p{stages}m{microbatches}-{uuid.uuid4().hex[:8]}"
    register_run(client, key, stages, microbatches)
    ingest_steps(client, key, stages, microbatches, range(steps), **kwargs)
    return key
