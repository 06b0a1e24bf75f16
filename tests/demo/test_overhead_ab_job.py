"""The demo job's --ab-block mode (the overhead benchmark's within-job A/B): instrumented and
uninstrumented steps alternate ABBA on the same stages, and only the instrumented ones reach the
service."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.support import LiveServer, run_pipeline_job, wait_for_steps

pytestmark = [pytest.mark.slow, pytest.mark.timing]


def test_ab_blocks_alternate_abba_and_only_instrumented_steps_are_recorded(
    sqlite_server: LiveServer, tmp_path: Path
) -> None:
    times = tmp_path / "times.json"
    job = run_pipeline_job(
        sqlite_server.url,
        stages=2,
        schedule="1f1b",
        microbatches=2,
        steps=12,
        hidden=64,
        extra_args=["--ab-block=2", f"--times-file={times}"],
    )
    assert job.returncode == 0, job.output[-3000:]
    document = json.loads(times.read_text())
    flags = [step["collected"] for step in document["steps"]]
    assert flags == [True, True, False, False, False, False, True, True, True, True, False, False]
    assert all(step["wall_s"] > 0 and step["cpu_s"] > 0 for step in document["steps"])
    assert document["shipper_cpu_s"] is not None
    with sqlite_server.client() as client:
        detail = wait_for_steps(client, job.run_key, ranks=2, steps=6)
        time.sleep(0.5)  # nothing more arrives: the 6 baseline steps were never steps to the collector
        detail = client.get(f"/api/v1/runs/{job.run_key}").json()
        assert [s["step"] for s in detail["steps"]] == list(range(6))
        kinds = {s["kind"] for s in client.get(f"/api/v1/runs/{job.run_key}/steps/5").json()["spans"]}
    assert {"forward", "backward", "all_reduce", "optimizer"} <= kinds


def test_ab_blocks_refuse_the_naive_schedule(sqlite_server: LiveServer) -> None:
    job = run_pipeline_job(
        sqlite_server.url, stages=2, schedule="naive", microbatches=1, steps=2, hidden=64, extra_args=["--ab-block=2"]
    )
    assert job.returncode != 0 and "--ab-block: needs a pipelining schedule" in job.output
