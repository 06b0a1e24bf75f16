"""/metrics with many runs heard from recently: a real ``serve`` (SQLite), ``--runs`` runs written straight into
its database (each with 2 ranks' aggregates of 10 steps, as a small job leaves them), then ``--scrapes``
scrapes timed one after another: seconds per scrape, bytes, and the server's resident memory before and at
its peak (VmHWM, reset before the scrapes). With the per-run series rendered in the background, the scrapes wait
for the first rendering (``bubblescope_metrics_runs_exported``) and the refresh's own time is printed too.

    python bench/metrics_scale.py [--runs 10000] [--scrapes 5] [--max-runs N]

``--max-runs`` is passed to ``serve --metrics-max-runs`` (left out: the default, 1,000). Figures in
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
from sqlalchemy import insert, select

from bubblescope.backend.db import migrate
from bubblescope.backend.db.engine import build_engine
from bubblescope.backend.db.models import Run, StepAggregate
from tests.support import LiveServer, start_server

STEPS, RANKS = 10, 2


def populate(url: str, runs: int) -> None:
    engine = build_engine(url)
    heard = datetime.now(timezone.utc).replace(tzinfo=None) - timedelta(minutes=5)
    with engine.begin() as connection:
        rows = [{"key": f"scale-{i:05d}", "name": "scale", "world_size": RANKS, "config": {}} for i in range(runs)]
        connection.execute(insert(Run), [{**row, "updated_at": heard} for row in rows])
        ids = connection.execute(select(Run.id)).scalars().all()
        base = 1_700_000_000_000_000_000
        steps = [
            {
                "run_id": run_id, "rank": rank, "step": step, "start_ns": base + step * 10**9,
                "end_ns": base + step * 10**9 + 9 * 10**8, "compute_ns": 6 * 10**8, "comm_ns": 10**8,
                "exposed_comm_ns": 5 * 10**7, "idle_ns": 2 * 10**8, "span_count": 0,
            }
            for run_id in ids for rank in range(RANKS) for step in range(STEPS)
        ]  # fmt: skip
        connection.execute(insert(StepAggregate), steps)
    engine.dispose()


def memory_kb(live: LiveServer, field: str) -> int:
    status = Path(f"/proc/{live.process.pid}/status").read_text()
    found = re.search(rf"^{field}:\s+(\d+) kB", status, re.M)
    return int(found.group(1)) if found else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--scrapes", type=int, default=5)
    parser.add_argument("--max-runs", type=int, default=None, help="serve --metrics-max-runs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{Path(folder) / 'bubblescope.db'}"
        migrate.upgrade(url)
        populate(url, args.runs)
        extra = [] if args.max_runs is None else ["--metrics-max-runs", str(args.max_runs)]
        live = start_server(url, Path(folder), extra_args=extra)
        try:
            with httpx.Client(base_url=live.url, timeout=600) as client:
                deadline = time.monotonic() + 600
                first = client.get("/metrics").text
                while "bubblescope_metrics_runs_exported" in first and time.monotonic() < deadline:
                    if re.search(r"^bubblescope_metrics_runs_exported \S+$", first, re.M):
                        break
                    time.sleep(0.5)
                    first = client.get("/metrics").text
                time.sleep(1.0)
                Path(f"/proc/{live.process.pid}/clear_refs").write_text("5")  # VmHWM from here
                before = memory_kb(live, "VmRSS")
                seconds, sizes = [], []
                for _ in range(args.scrapes):
                    started = time.perf_counter()
                    text = client.get("/metrics").text
                    seconds.append(time.perf_counter() - started)
                    sizes.append(len(text.encode()))
                peak = memory_kb(live, "VmHWM")
        finally:
            live.stop()
    refresh = re.search(r"^bubblescope_metrics_refresh_seconds (\S+)$", text, re.M)
    exported = re.search(r"^bubblescope_metrics_runs_exported (\S+)$", text, re.M)
    print(f"runs heard from in 6 h: {args.runs:,}; per-run series exported: {exported.group(1) if exported else 'all'}")
    print(
        f"scrape: median {statistics.median(seconds):.3f} s, max {max(seconds):.3f} s, {max(sizes) / 1e6:.2f} MB; "
        f"server RSS {before / 1024:.0f} MB before, peak +{(peak - before) / 1024:.0f} MB over {args.scrapes} scrapes"
    )
    if refresh:
        print(f"background refresh of the per-run series: {float(refresh.group(1)):.2f} s")


if __name__ == "__main__":
    main()
