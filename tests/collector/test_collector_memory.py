"""Collector memory stays flat over a run (``bench/collector_memory.py``, 20 spans a step).

The bench runs 5,000 steps here (its default, 10,000, is the figure docs/benchmarks.md reports).
Traced memory at step 1,000 and 5,000 is compared once the shipper has caught up; a leak of 16
bytes a step (64 KiB over 4,000 steps) fails, where a healthy collector's figure moves by 1-3 KiB.
RSS, from a run without tracemalloc, gets a loose bound: it moves by a few MiB as the allocator
warms up, whatever the collector does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support import REPO, LiveServer

STEPS, FROM = 5_000, 1_000
TRACED_GROWTH_LIMIT = 16 * (STEPS - FROM)
RSS_GROWTH_LIMIT = 16 * 1024 * 1024


def run_bench(*args: str) -> dict:
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "collector_memory.py"), "--json", "--steps", str(STEPS), *args],
        capture_output=True,
        text=True,
        timeout=300,
        # the bench waits for a flush at every checkpoint: flushing often makes those waits short
        env={**os.environ, "BUBBLESCOPE_FLUSH_INTERVAL_S": "0.05"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("where", ["service down, small spool", "real service"])
def test_memory_does_not_grow_with_run_length(where: str, sqlite_server: LiveServer) -> None:
    args = ["--spool-max-bytes", str(64 * 1024)] if where.startswith("service down") else ["--url", sqlite_server.url]
    result = run_bench(*args)
    by_step = {row["step"]: row for row in result["figures"]}
    print(where, json.dumps(result))
    traced = by_step[STEPS]["traced_bytes"] - by_step[FROM]["traced_bytes"]
    rss = by_step[STEPS]["rss_bytes"] - by_step[FROM]["rss_bytes"]
    assert traced < TRACED_GROWTH_LIMIT, result
    assert rss < RSS_GROWTH_LIMIT, result
    if where.startswith("service down"):
        assert result["dropped_spans"] > 0, "the spool bound should have been reached"
    else:
        assert result["dropped_spans"] == 0
