"""Real pipeline jobs measured through the service, for the replay's accuracy checks (tests and bench)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import httpx

from tests.support import run_pipeline_job, wait_for_steps


@dataclass(frozen=True)
class JobShape:
    """One configuration of the demo job: its schedule, micro-batching and layer split."""

    schedule: str
    microbatches: int
    layers: tuple[int, ...]
    microbatch_size: int = 64
    hidden: int = 768
    steps: int = 16
    stages_per_rank: int = 1  # layers has ranks × stages_per_rank counts
    device_ms: float = 0.0  # each layer's simulated device time (demo_job --device-ms): steady, as on a GPU

    @property
    def ranks(self) -> int:
        return len(self.layers) // self.stages_per_rank

    @property
    def label(self) -> str:
        looped = f" v={self.stages_per_rank}" if self.stages_per_rank > 1 else ""
        device = f" device={self.device_ms:g}ms" if self.device_ms else ""
        return f"{self.schedule}{looped} m={self.microbatches} b={self.microbatch_size} layers={','.join(map(str, self.layers))}{device}"

    def applied(self, change: dict[str, Any]) -> JobShape:
        """This shape after a suggestion's ``apply`` (the run-config keys it changes)."""
        return replace(
            self,
            schedule=change.get("schedule", self.schedule),
            microbatches=change.get("num_microbatches", self.microbatches),
            microbatch_size=change.get("microbatch_size", self.microbatch_size),
            layers=tuple(change.get("layers_per_stage", self.layers)),
            stages_per_rank=change.get("virtual_stages", self.stages_per_rank if "schedule" not in change else 1),
        )


def run_and_analyse(url: str, client: httpx.Client, shape: JobShape) -> tuple[str, dict[str, Any]]:
    """Run the job on ``shape.ranks`` ranks, wait for every step, return (run key, its analysis)."""
    ranks = shape.ranks
    job = run_pipeline_job(
        url,
        stages=ranks,
        schedule=shape.schedule,
        microbatches=shape.microbatches,
        steps=shape.steps,
        hidden=shape.hidden,
        microbatch_size=shape.microbatch_size,
        extra_args=[
            f"--layers={','.join(map(str, shape.layers))}",
            f"--stages-per-rank={shape.stages_per_rank}",
            f"--device-ms={shape.device_ms}",
        ],
        extra_env={"BUBBLESCOPE_FLUSH_INTERVAL_S": "1.0"},  # the service's ingest work stays off the job's cores
    )
    assert job.returncode == 0, job.output[-3000:]
    wait_for_steps(client, job.run_key, ranks, shape.steps)
    response = client.get(f"/api/v1/runs/{job.run_key}/analysis")
    assert response.status_code == 200, response.text
    return job.run_key, response.json()


def what_if(client: httpx.Client, run_key: str, base: JobShape, target: JobShape) -> dict[str, Any]:
    """The service's replay of ``run_key`` (measured as ``base``) changed into ``target``."""
    body: dict[str, Any] = {
        "schedule": target.schedule,
        "microbatches": target.microbatches,
        "microbatch_scale": target.microbatch_size / base.microbatch_size,
    }
    if target.layers != base.layers:
        body["layers_per_stage"] = list(target.layers)
    if target.stages_per_rank > 1:
        body["stages_per_rank"] = target.stages_per_rank
    response = client.post(f"/api/v1/runs/{run_key}/whatif", json=body)
    assert response.status_code == 200, response.text
    return response.json()
