"""``bubblescope demo --tour``: the textbook lessons, one run each, streamed one after another into one service.

Each stop is a real torchrun job (gloo, CPU) but the last, a 1,024-rank run replayed by the analysis' simulator and
sent over the API, which its title calls synthetic. Before its job starts, the tour registers each run with a
``title`` (what was done, what the page shows) and, for a re-run, ``compare_with`` (the run it changes), so that the
run list reads like the lessons and links each pair to its comparison. The hang's job is ended once its alert
fires. Every job runs 2 ranks but the hybrid's 4, whose compute is time asleep, as a GPU's is to its CPU
(``demo_job --device-ms``), so that they run side by side on 2 cores. Each run's state is checked once its job is
over (finished, failed, or hung until its alert fired), and a stop that ends otherwise prints its job's output.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import httpx

from bubblescope import wire

HANG_ALERT_WITHIN_S = 120.0
"""How long the tour waits for the hung run's alert before ending its job anyway."""
HUNG_AFTER_S = 8.0
"""The hung run's own alert threshold (its config's ``alerts.hung_after_s``): the tour waits this, not 5 minutes."""
WIDTH = 2048
"""The pipeline jobs' width (``demo_job --hidden``): each stage's compute outweighs the runtime's overheads."""
BATCH = 256
"""Samples per step in every pipeline job, however they are split into micro-batches."""


@dataclass(frozen=True)
class Stop:
    slug: str
    title: str
    ranks: int
    job: tuple[str, ...]  # a module run under torchrun and its options; empty: the synthetic replay
    compare_with: str | None = None  # the slug of the stop this one re-runs with a change
    config: dict[str, object] = dataclasses.field(default_factory=dict)
    expect: Literal["finished", "failed", "hung"] = "finished"  # the run's state once its job is over (hung: ended
    # by the tour once its alert fired)


def pipeline(*options: str) -> tuple[str, ...]:
    return ("bubblescope.demo_job", f"--hidden={WIDTH}", f"--batch-size={BATCH}", "--steps=20", *options)


def data_parallel(*options: str) -> tuple[str, ...]:
    return ("bubblescope.data_parallel_job", "--steps=16", *options)


STOPS: tuple[Stop, ...] = (
    Stop(
        "layerwise",
        "Layer-wise split over 2 ranks, the whole batch at once: one rank works while the other waits, "
        "a bubble near (p−1)/p = 50%",
        2,
        pipeline("--schedule=naive", "--microbatches=1"),
    ),
    Stop(
        "pipelined",
        "The same model and batch pipelined: 1F1B over 8 micro-batches shrinks the bubble toward (p−1)/(m+p−1) = 11%",
        2,
        pipeline("--schedule=1f1b", "--microbatches=8"),
        compare_with="layerwise",
    ),
    Stop(
        "imbalanced",
        "Unequal stages: 1 layer on stage 0, 3 on stage 1; stage 0 waits for stage 1 on every micro-batch",
        2,
        pipeline("--schedule=1f1b", "--microbatches=8", "--layers=1,3"),
    ),
    Stop(
        "rebalanced",
        "The imbalanced run re-run with 2 layers on each stage: the same work, a shorter step",
        2,
        pipeline("--schedule=1f1b", "--microbatches=8", "--layers=2,2"),
        compare_with="imbalanced",
    ),
    Stop(
        "ddp",
        "Plain DDP, no pipeline, instrumented as docs/collector.md says: compute and the gradient all-reduce",
        2,
        data_parallel("--mode=ddp"),
    ),
    Stop(
        "late-rank",
        "The same DDP job with rank 1 late by 100 ms a step: rank 0 waits for it inside the all-reduce",
        2,
        data_parallel("--mode=ddp", "--late-rank=1", "--late-ms=100"),
        compare_with="ddp",
    ),
    Stop(
        "fsdp2",
        "FSDP2 (fully_shard per block): parameters gathered and gradients reduce-scattered around the compute",
        2,
        data_parallel("--mode=fsdp2"),
    ),
    Stop(
        "hybrid",
        "DP × PP: 2 replicas of a 2-stage 1F1B pipeline on 4 ranks; each layer's compute is time asleep, as a GPU's",
        4,
        (
            "bubblescope.demo_job",
            "--dp=2",
            "--schedule=1f1b",
            "--microbatches=4",
            "--hidden=256",
            "--device-ms=10",
            "--steps=12",
        ),
    ),
    Stop(
        "crash",
        "A crash: rank 1 raises at step 4; the page names it as the culprit and says what to read first",
        2,
        pipeline("--schedule=1f1b", "--microbatches=2", "--inject=raise", "--inject-rank=1", "--inject-step=4"),
        expect="failed",
    ),
    Stop(
        "hang",
        "A hang: rank 1 stops before the gradient all-reduce at step 4; the alert names it, then the tour ends the job",
        2,
        pipeline(
            "--schedule=1f1b", "--microbatches=2", "--inject=hang-collective", "--inject-rank=1", "--inject-step=4"
        ),
        config={"alerts": {"hung_after_s": HUNG_AFTER_S}},
        expect="hung",
    ),
    Stop(
        "1024-ranks",
        "Synthetic, not a real job: 1,024 ranks (8 stages × 128 replicas) replayed by the simulator, rank 517 "
        "computing 30% slower; the others wait for it",
        1024,
        (),
    ),
)
SYNTHETIC_SLOW_RANK = 517


def job_command(stop: Stop) -> list[str]:
    module, *options = stop.job
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={stop.ranks}",
        "-m",
        module,
        *options,
    ]


def end_group(process: subprocess.Popen[bytes]) -> None:
    """Kills the job unless it has ended: torchrun's process group, and each worker's, since torchrun starts its
    workers in sessions of their own (a hung worker, blocked in a collective, would outlive torchrun's group)."""
    if process.poll() is None:
        for group in (process.pid, *_children(process.pid)):
            try:
                os.killpg(group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    process.wait()


def _children(pid: int) -> list[int]:
    """The process's children (Linux's /proc; none where it cannot be read)."""
    children: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as listing:
                children += [int(child) for child in listing.read().split()]
    except OSError:
        pass
    return children


class Tour:
    """The stops run one after another into the service at ``base``; ``say`` prints a line."""

    def __init__(self, base: str, say: Callable[[str], None]) -> None:
        self.base, self.say = base, say
        self.suffix = uuid.uuid4().hex[:6]
        self.client = httpx.Client(base_url=base, timeout=60)
        self.keys: dict[str, str] = {}

    def key_of(self, index: int, stop: Stop) -> str:
        return f"tour-{index:02d}-{stop.slug}-{self.suffix}"

    def register(self, key: str, index: int, stop: Stop) -> None:
        config: dict[str, object] = {"title": stop.title, **stop.config}
        if stop.compare_with:
            config["compare_with"] = self.keys[stop.compare_with]
        body = {"name": f"tour {index:02d} · {stop.slug}", "world_size": stop.ranks, "config": config}
        self.client.put(f"{wire.API_PREFIX}/runs/{key}", json=body).raise_for_status()

    def run(self, stops: tuple[Stop, ...] = STOPS) -> int:
        """Runs every stop; returns how many did not go as planned."""
        wrong = 0
        for index, stop in enumerate(stops, start=1):
            key = self.key_of(index, stop)
            self.keys[stop.slug] = key
            self.say(f"[{index}/{len(stops)}] {stop.slug}: {stop.title}")
            began = time.monotonic()
            self.register(key, index, stop)
            ok = self.job(key, index, stop) if stop.job else self.synthetic(key, stop)
            if not stop.job:  # the replay registers the run as the bench does: its name and title again
                self.register(key, index, stop)
            wrong += not ok
            outcome = "done" if ok else "did NOT go as planned"
            self.say(f"    {outcome} in {time.monotonic() - began:.0f} s: {self.base}/runs/{key}")
        return wrong

    def environment(self, key: str, index: int, stop: Stop) -> dict[str, str]:
        return {
            **os.environ,
            "BUBBLESCOPE_URL": self.base,
            "BUBBLESCOPE_RUN_ID": key,
            "BUBBLESCOPE_RUN": f"tour {index:02d} · {stop.slug}",
            "BUBBLESCOPE_FLUSH_INTERVAL_S": "1.0",
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        }

    def job(self, key: str, index: int, stop: Stop) -> bool:
        """Runs the stop's job, its output kept in a file (its tail printed when the run did not end as expected);
        however the tour ends (Ctrl-C included), no process of the job outlives it."""
        with tempfile.TemporaryFile("w+") as log:
            process = subprocess.Popen(
                job_command(stop),
                env=self.environment(key, index, stop),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # ended as a whole (torchrun and its workers), and spared the tour's Ctrl-C
            )
            try:
                fired = self.wait_for_alert(key, "BubblescopeRunHung", process) if stop.expect == "hung" else None
                if fired is None:
                    process.wait()
            finally:
                end_group(process)
            ok = fired if fired is not None else self.state_of(key) == stop.expect
            if not ok:
                log.seek(0)
                self.say("    its output ended with:\n" + "".join(log.readlines()[-30:]))
            return ok

    def state_of(self, key: str) -> str | None:
        response = self.client.get(f"{wire.API_PREFIX}/runs/{key}")
        return str(response.json()["state"]) if response.status_code == 200 else None

    def wait_for_alert(self, key: str, name: str, process: subprocess.Popen[bytes]) -> bool:
        deadline = time.monotonic() + HANG_ALERT_WITHIN_S
        while time.monotonic() < deadline and process.poll() is None:
            alerts = self.client.get(f"{wire.API_PREFIX}/alerts", params={"run": key, "state": "firing"}).json()
            if any(a["labels"]["alertname"] == name for a in alerts["alerts"]):
                self.say(f"    {name} fired; ending the job")
                return True
            time.sleep(1.0)
        return False

    def synthetic(self, key: str, stop: Stop) -> bool:
        from bubblescope.synthetic_run import SyntheticJob, end_job, register_job, send_job

        job = SyntheticJob(
            stages=8, replicas=stop.ranks // 8, steps=12, full_every=4, slow=((SYNTHETIC_SLOW_RANK, 1.3),)
        )
        register_job(self.client, job, key, senders=4)
        send_job(self.client, job, key, steps_per_batch=job.steps, senders=4)
        end_job(self.client, job, key, senders=4)
        return True
