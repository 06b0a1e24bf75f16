"""A big synthetic run through one service: ingest over HTTP, then every request the run page makes,
timed and sized, and (``--page``) the run page itself in Chromium.

The run comes from ``bubblescope/synthetic_run.py`` (stages × replicas ranks, a schedule replayed by the
analysis's simulator, injected slow ranks) and is sent as the collector sends it: gzip JSON batches,
full spans every 10th step, aggregates every step. ``--steps-per-batch 1`` is the collector's cadence
at a ~1 s step (one batch per rank and flush); a larger value sends fewer, bigger batches.

    python bench/scale.py [--db sqlite|postgres] [--stages 8] [--replicas 128] [--steps 20]
                          [--schedule Schedule1F1B] [--steps-per-batch 20] [--senders 4] [--page]

Prints: ingest batches/s and spans/s with p50/p99 request latency; then per read endpoint the
first timing and the median of the ``--repeats - 1`` after it, the answer's size as JSON and as
gzip on the wire, and a revalidation with the ETag where one is sent (status and time);
with ``--page``, first (nothing asked for yet; ``--quiet-s S``: S seconds after the ingest, as a run that
went quiet), the seconds from navigation until every card of the run page is drawn.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bubblescope.synthetic_run import SyntheticJob, register_job, send_job
from tests.support import LiveServer, migrated_database, start_server


def page_requests(job: SyntheticJob, run_key: str) -> dict[str, str]:
    """What the run page asks for (frontend/api.js), by a short label."""
    newest_full = max(step for step in range(job.steps) if job.has_spans(step))
    base = f"/api/v1/runs/{run_key}"
    return {
        "run": f"{base}?ranks_limit=1024",
        f"step {newest_full}": f"{base}/steps/{newest_full}?breakdown_limit=1024",
        "analysis": f"{base}/analysis",
        "stragglers": f"{base}/stragglers?phases=compute&compact=true",
        "alerts firing": f"/api/v1/alerts?state=firing&run={run_key}&limit=100",
        "alerts resolved": f"/api/v1/alerts?state=resolved&run={run_key}&limit=5",
        "run list": "/api/v1/runs",
    }


def time_reads(client: httpx.Client, requests: dict[str, str], repeats: int) -> None:
    print(f"{'request':18s} {'first ms':>9s} {'again ms':>9s} {'bytes':>11s} {'gzip bytes':>11s} {'revalidated':>14s}")
    for label, path in requests.items():
        timings = []
        size, wire_size, etag = 0, 0, None
        for _ in range(repeats):
            began = time.perf_counter()
            response = client.get(path, headers={"Accept-Encoding": "gzip"})
            timings.append(1000 * (time.perf_counter() - began))
            response.raise_for_status()
            size, wire_size, etag = len(response.content), response.num_bytes_downloaded, response.headers.get("etag")
        revalidated = "-"
        if etag:
            began = time.perf_counter()
            again = client.get(path, headers={"If-None-Match": etag})
            revalidated = f"{again.status_code} {1000 * (time.perf_counter() - began):.0f} ms"
        print(
            f"{label:18s} {timings[0]:9.0f} {statistics.median(timings[1:] or timings):9.0f} "
            f"{size:11,d} {wire_size:11,d} {revalidated:>14s}"
        )


def time_page(url: str, run_key: str, screenshots: Path | None = None) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium")
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        errors: list[str] = []
        page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
        asked: dict[str, float] = {}
        answered: list[tuple[str, float, float]] = []  # path, asked, answered: seconds after navigation
        page.on("request", lambda request: asked.setdefault(request.url, time.perf_counter()))
        page.on(
            "requestfinished",
            lambda request: answered.append((request.url, asked.pop(request.url, 0.0), time.perf_counter())),
        )
        for visit in ("first visit (nothing cached)", "second visit (answers stored)"):
            answered.clear()
            began = time.perf_counter()
            page.goto(f"{url}/runs/{run_key}")
            painted = time.perf_counter() - began
            page.wait_for_selector("body[data-drawn='true']", timeout=300_000)
            drawn = time.perf_counter() - began
            print(f"run page, {visit}: loaded {painted:.2f} s, every card drawn {drawn:.2f} s")
            for request_url, start, end in answered:  # the waterfall of the page's API requests
                if "/api/" in request_url:
                    path = request_url.split("/api/v1", 1)[-1].split("?", 1)[0]
                    print(f"    {start - began:6.2f} -> {end - began:6.2f} s  {path}")
        for width in (1440, 900) if screenshots else ():
            page.set_viewport_size({"width": width, "height": 900})
            page.goto(f"{url}/runs/{run_key}")
            page.wait_for_selector("body[data-drawn='true']", timeout=300_000)
            page.screenshot(path=str(screenshots / f"run-page-{width}.png"), full_page=width == 1440)
        print(f"console errors: {len(errors)}")
        browser.close()


@contextmanager
def service(db: str) -> Iterator[LiveServer]:
    with services(db, 1) as (live,):
        yield live


@contextmanager
def services(db: str, count: int) -> Iterator[list[LiveServer]]:
    """``count`` serve processes on one new database (the first to start leads the background work)."""
    folder = Path(tempfile.mkdtemp(prefix="bubblescope-scale-"))
    with migrated_database(db, folder) as url:
        started: list[LiveServer] = []
        try:
            for _ in range(count):
                started.append(start_server(url, folder))
            yield started
        finally:
            for live in started:
                live.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--stages", type=int, default=8)
    parser.add_argument("--replicas", type=int, default=128)
    parser.add_argument("--microbatches", type=int, default=16)
    parser.add_argument("--schedule", default="Schedule1F1B")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--steps-per-batch", type=int, default=20)
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--slow", type=int, default=None, help="a rank computing 1.3x (default: world_size // 3)")
    parser.add_argument("--page", action="store_true", help="also time the run page in Chromium")
    parser.add_argument("--screenshots", type=Path, help="with --page: save the page at 1440 and 900 px in this folder")
    parser.add_argument(
        "--quiet-s", type=float, default=0.0, help="wait this long after the ingest before the page (a run gone quiet)"
    )
    args = parser.parse_args()
    probe = SyntheticJob(stages=args.stages, replicas=args.replicas)
    slow = args.slow if args.slow is not None else probe.world_size // 3
    job = SyntheticJob(
        stages=args.stages,
        replicas=args.replicas,
        microbatches=args.microbatches,
        schedule=args.schedule,
        steps=args.steps,
        slow=((slow, 1.3),),
    )
    run_key = f"scale-{uuid.uuid4().hex[:8]}"
    print(
        f"{job.world_size:,} ranks ({job.stages} stages x {job.replicas} replicas, {job.schedule}, "
        f"{job.microbatches} micro-batches), {job.steps} steps of {job.step_ns / 1e6:.0f} ms, rank {slow} 1.3x slow; "
        f"{args.db}"
    )
    with service(args.db) as live, httpx.Client(base_url=live.url, timeout=300) as client:
        began = time.perf_counter()
        register_job(client, job, run_key, args.senders)
        print(f"registered {job.world_size:,} ranks in {time.perf_counter() - began:.1f} s")
        figures = send_job(client, job, run_key, args.steps_per_batch, args.senders)
        print(
            f"ingest: {figures['batches']:,.0f} batches, {figures['spans']:,.0f} spans ({figures['wire_mb']:.1f} MB gzip) "
            f"in {figures['seconds']:.1f} s = {figures['batches'] / figures['seconds']:.0f} batches/s, "
            f"{figures['spans'] / figures['seconds']:,.0f} spans/s; latency p50 {figures['p50_ms']:.0f} ms, "
            f"p99 {figures['p99_ms']:.0f} ms ({args.senders} senders, {args.steps_per_batch} steps per batch)"
        )
        if args.page:  # first, while nothing was asked for
            time.sleep(args.quiet_s)  # the service stores a quiet run's page answers itself (warm_views)
            time_page(live.url, run_key, args.screenshots)
        time_reads(client, page_requests(job, run_key), args.repeats)


if __name__ == "__main__":
    main()
