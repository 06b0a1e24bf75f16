"""The run list with many runs: ``--runs`` runs registered over HTTP (one in ten with a batch of steps,
one in a hundred failed), then each list request of the run list page timed: the first page, the next
one by cursor, a name filter, a state filter that matches few runs, and runs heard within the last hour.

    python bench/run_list.py [--runs 10000] [--db sqlite|postgres] [--repeats 5]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.scale import service
from tests.support import ingest_batch, post_gzip


def populate(client: httpx.Client, runs: int, tag: str) -> None:
    def one(index: int) -> None:
        key = f"{tag}-{index:05d}"
        client.put(f"/api/v1/runs/{key}", json={"name": f"job {index % 97}", "world_size": 1}).raise_for_status()
        if index % 10 == 0:
            client.put(f"/api/v1/runs/{key}/ranks/0", json={"host": "h", "pid": index}).raise_for_status()
            post_gzip(client, ingest_batch(key, seq=0, step=0)).raise_for_status()
        if index % 100 == 0:
            end = {"outcome": "failed", "error": "RuntimeError: boom", "pid": index}
            client.put(f"/api/v1/runs/{key}/ranks/0/end", json=end).raise_for_status()

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(runs)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    tag = f"list-{uuid.uuid4().hex[:6]}"
    with service(args.db) as live, httpx.Client(base_url=live.url, timeout=120) as client:
        began = time.perf_counter()
        populate(client, args.runs, tag)
        print(f"{args.runs:,} runs registered in {time.perf_counter() - began:.0f} s ({args.db})")
        first = client.get("/api/v1/runs", params={"limit": 50})
        hour_ago = (datetime.now(timezone.utc) - timedelta(hours=1)).isoformat()
        requests = {
            "first page (50)": {"limit": 50},
            "next page, by cursor": {"limit": 50, "cursor": first.headers["x-next-cursor"]},
            "name filter": {"limit": 50, "name": "job 42"},
            "state=failed (1%)": {"limit": 50, "state": "failed"},
            "heard within 1 h": {"limit": 50, "since": hour_ago},
        }
        print(f"{'request':24s} {'median ms':>10s} {'worst ms':>9s} {'runs':>5s}")
        for label, params in requests.items():
            timings = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                response = client.get("/api/v1/runs", params=params)
                timings.append(1000 * (time.perf_counter() - t))
                response.raise_for_status()
            print(f"{label:24s} {statistics.median(timings):10.0f} {max(timings):9.0f} {len(response.json()):5d}")


if __name__ == "__main__":
    main()
