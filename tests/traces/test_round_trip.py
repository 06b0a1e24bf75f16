"""The round trip: a real CPU pipeline job (gloo, 1F1B over 2 ranks, written from the README's snippet) is both
collected by bubblescope and profiled by torch.profiler; importing its traces gives, per rank, the same compute,
exposed communication and idle share of the step as the collector measured, within 5% of the step (the median
over the profiled steps: the first profiled step carries the profiler's own start-up)."""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import LiveServer, run_rows, run_torchrun

pytestmark = pytest.mark.slow
STEPS = 8  # torch.profiler's schedule: 1 waiting, 1 warming up, 6 recorded (steps 2-7)
SHARES = ("compute", "exposed communication", "idle")


def shares_by_rank(db_url: str, run_key: str, steps: set[int]) -> dict[int, list[float]]:
    """Per rank, the median over ``steps`` of compute, exposed communication and idle over the step's window."""
    rows = run_rows(
        db_url,
        run_key,
        "SELECT rank, step, end_ns - start_ns, compute_ns, exposed_comm_ns, idle_ns FROM steps WHERE run_id = {run}",
    )
    per_rank: dict[int, list[tuple[float, float, float]]] = {}
    for rank, step, window, compute, exposed, idle in rows:
        if step in steps:
            per_rank.setdefault(rank, []).append((compute / window, exposed / window, idle / window))
    return {rank: [statistics.median(v[i] for v in values) for i in range(3)] for rank, values in per_rank.items()}


def test_a_profiled_pipeline_job_imports_as_the_collector_measured_it(
    sqlite_server: LiveServer, tmp_path: Path
) -> None:
    job = run_torchrun(
        sqlite_server.url,
        "tests/traces/profiled_pipeline_job.py",
        2,
        f"--trace-dir={tmp_path}",
        f"--steps={STEPS}",
        run_key="round-trip-collected",
    )
    assert job.returncode == 0, job.output[-3000:]
    traces = sorted(tmp_path.glob("rank*.json"))
    assert [t.name for t in traces] == ["rank0.json", "rank1.json"]
    done = subprocess.run(
        [sys.executable, "-m", "bubblescope.cli", "import-trace", *map(str, traces), "--url", sqlite_server.url]
        + ["--run", "round-trip-imported"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    profiled = set(range(2, STEPS))
    collected = shares_by_rank(sqlite_server.db_url, "round-trip-collected", profiled)
    imported = shares_by_rank(sqlite_server.db_url, "round-trip-imported", profiled)
    assert sorted(imported) == sorted(collected) == [0, 1], (collected, imported)
    for rank in (0, 1):
        for what, ours, theirs in zip(SHARES, imported[rank], collected[rank]):
            assert abs(ours - theirs) <= 0.05, (rank, what, f"imported {ours:.1%}, collected {theirs:.1%}")
