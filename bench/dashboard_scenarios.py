"""The run page on each textbook scenario, as docs/dashboard.md shows it: real CPU jobs into a real
service, then headless Chromium's screenshots of the page's cards at 1440 and 900 px.

Scenarios: a naive layer-wise split at the README's sizes; the same model pipelined as suggested
(1F1B, 2 micro-batches of the same batch); an imbalanced 1F1B (1 and 3 layers, no split declared);
an all-reduce waiting on a late rank (``tests/analysis/injected_job.py --late``); a crashed run
(a rank raises at step 3); a DP×PP hybrid mesh; and jobs without a pipeline written from docs/collector.md
(``tests/runs/user_jobs.py``): DDP, FSDP2 per block, DDP with one rank late to the all-reduce. For each it
prints the figures the page shows: measured bubble and its floor (or, without a pipeline, the step's
parts), the top suggestion, the stage nearest its memory limit.

    python bench/dashboard_scenarios.py [--out docs/dashboard] [--only naive,crash]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from tests.support import (
    JobResult,
    LiveServer,
    migrated_database,
    run_parallel_job,
    run_pipeline_job,
    run_torchrun,
    start_server,
    wait_for_steps,
)

CARDS = {  # the page's parts docs/dashboard.md shows, by file name
    "glance": "#glance",
    "analysis": "#analysis",
    "breakdown": ".card:has(#breakdown)",
    "ranks": "#ranks",
    "alerts": "#run-alerts",
}
Job = Callable[[str], tuple[JobResult, int, int]]  # service URL -> (the job, its ranks, steps to wait for)


def naive(url: str) -> tuple[JobResult, int, int]:
    return run_pipeline_job_at_defaults(url, "naive", 1, "--layers=2,2"), 2, 12


def pipelined(url: str) -> tuple[JobResult, int, int]:
    return run_pipeline_job_at_defaults(url, "1f1b", 2, "--layers=2,2"), 2, 12


def imbalanced(url: str) -> tuple[JobResult, int, int]:
    return run_pipeline_job_at_defaults(url, "1f1b", 8, "--layers=1,3"), 2, 12


def late_rank(url: str) -> tuple[JobResult, int, int]:
    args = ("--steps=12", "--microbatches=4", "--late=1:60:6,7,8,9,10,11")
    return run_torchrun(url, "tests/analysis/injected_job.py", 2, *args, run_key=key("late-rank")), 2, 12


def crash(url: str) -> tuple[JobResult, int, int]:
    return run_parallel_job(url, "naive", 2, "--steps=8", "--batch=512", "--layers=4", "--raise-at=1:3"), 2, 3


def hybrid(url: str) -> tuple[JobResult, int, int]:
    return run_parallel_job(url, "hybrid2d", 4, "--steps=10", "--batch=256", "--layers=4"), 4, 10


def user_job(name: str, mode: str, *args: str) -> Job:
    """A job without a pipeline, written from docs/collector.md alone (``tests/runs/user_jobs.py``)."""

    def job(url: str) -> tuple[JobResult, int, int]:
        report = Path(tempfile.mkdtemp(prefix="bubblescope-own-")) / "own"
        command = (mode, f"--run-name={name}", f"--report={report}", "--steps=24", *args)
        return run_torchrun(url, "tests/runs/user_jobs.py", 2, *command, run_key=key(name)), 2, 3  # spans: 0, 10, 20

    return job


SCENARIOS: dict[str, Job] = {
    "naive": naive,
    "pipelined": pipelined,
    "imbalanced": imbalanced,
    "late-rank": late_rank,
    "crash": crash,
    "hybrid": hybrid,
    "ddp": user_job("ddp", "ddp", "--layers=6"),
    "fsdp2": user_job("fsdp2", "fsdp2", "--layers=6", "--blocks"),
    "ddp-late-rank": user_job("ddp-late-rank", "ddp", "--layers=6", "--slow-rank=1", "--slow-ms=30"),
}


def key(name: str) -> str:
    return f"scenario-{name}-{uuid.uuid4().hex[:6]}"


def run_pipeline_job_at_defaults(url: str, schedule: str, microbatches: int, *extra: str) -> JobResult:
    """The demo job at its default sizes (hidden 512, a batch of 256 split into the micro-batches)."""
    from bubblescope.demo_job import DEFAULT_BATCH_SIZE, DEFAULT_HIDDEN

    return run_pipeline_job(
        url,
        stages=2,
        schedule=schedule,
        microbatches=microbatches,
        steps=12,
        hidden=DEFAULT_HIDDEN,
        microbatch_size=DEFAULT_BATCH_SIZE // microbatches,
        extra_args=list(extra),
        extra_env={"BUBBLESCOPE_FLUSH_INTERVAL_S": "1.0"},
    )


def headline(analysis: dict[str, Any]) -> str:
    """The figures the page's analysis card shows, on one line."""
    parts = []
    split = analysis.get("step_split")
    if split:
        shown = {p["name"]: p["fraction_of_step"] for p in split["parts"]}
        parts.append(", ".join(f"{name} {100 * share:.1f}%" for name, share in shown.items()))
        if split["culprit"]:
            parts.append(f"late rank {split['culprit']['rank']}")
    a = analysis.get("attribution")
    if a:
        parts.append(
            f"bubble {100 * a['measured_bubble_fraction']:.1f}% (floor {100 * a['simulated_floor_fraction']:.1f}%)"
        )
    if analysis.get("suggestions"):
        top = analysis["suggestions"][0]
        parts.append(f"top: {top['title']} ({100 * top['gain_fraction']:+.1f}%)")
    else:
        parts.append("no suggestion")
    exposed = analysis.get("exposed_comm_ns_by_group") or {}
    if exposed:
        parts.append("exposed " + ", ".join(f"{g} {ns / 1e6:.1f} ms" for g, ns in sorted(exposed.items())))
    nearest = next((m for m in analysis.get("memory", []) if m["nearest_limit"]), None)
    if nearest:
        parts.append(f"memory: stage {nearest['stage']} {nearest['peak_bytes'] / 2**20:.0f} MiB")
    left = analysis.get("partial_steps_left_out")
    if left:
        parts.append(f"partial steps left out {left}")
    return "; ".join(parts)


def screenshot(url: str, run_key: str, name: str, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium")
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        for width in (1440, 900):
            page.set_viewport_size({"width": width, "height": 900})
            page.goto(f"{url}/runs/{run_key}")
            page.wait_for_selector("body[data-drawn='true']", timeout=120_000)
            page.screenshot(path=str(out / f"{name}-page-{width}.png"), full_page=True)
            for part, selector in CARDS.items():
                if page.locator(selector).is_visible():
                    page.locator(selector).screenshot(path=str(out / f"{name}-{part}-{width}.png"))
        browser.close()


def run(live: LiveServer, names: list[str], out: Path) -> None:
    with httpx.Client(base_url=live.url, timeout=60) as client:
        for name in names:
            job, ranks, steps = SCENARIOS[name](live.url)
            if name != "crash":
                assert job.returncode == 0, job.output[-3000:]
            wait_for_steps(client, job.run_key, ranks, steps)
            analysis = client.get(f"/api/v1/runs/{job.run_key}/analysis").json()
            print(f"{name:11s} {job.run_key}: {headline(analysis)}", flush=True)
            screenshot(live.url, job.run_key, name, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("test-output/dashboard"))
    parser.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenario names")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="bubblescope-scenarios-"))
    with migrated_database("sqlite", folder) as url:
        live = start_server(url, folder)
        try:
            run(live, args.only.split(","), args.out)
        finally:
            live.stop()


if __name__ == "__main__":
    main()
