"""Runs imported from the reference profiler traces (``bubblescope import-trace``) on the run page, in headless
Chromium at 1440 and 900 px: the page says where each came from (its files, the profiler, its steps), counts the
imported ranks against the job's world, shows no warm-up or partial step, and breaks the step down."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.support import LiveServer
from tests.traces.support import JOBS, job_files

pytestmark = [pytest.mark.browser, pytest.mark.slow]
WORLDS = {
    "hta_trace_filter_2rank": "2 of 128",
    "nccl_data_rank0_of2_a100": "1 of 2",
    "trace_diff_control_rank3_of8_a100": "1 of 8",
    "h100_ddp_from_docs": "1 of 1",  # ours, from an H100 (tests/traces/data/h100)
    "h100_fsdp2_from_docs": "1 of 1",
}

STACKS = {  # what a trace says of the stack that wrote it: its GPU, CUPTI, CUDA and NCCL versions
    "h100_ddp_from_docs": ("NVIDIA H100 80GB HBM3", "CUPTI 130001", "CUDA runtime 13000", "NCCL 2.28.9"),
    "nccl_data_rank0_of2_a100": ("NVIDIA A100", "NCCL 2.17.1"),
}


@pytest.mark.parametrize("job", sorted(JOBS))
def test_an_imported_run_says_where_it_came_from(
    browser: Any, sqlite_server: LiveServer, output_dir: Path, job: str
) -> None:
    files = job_files(job)
    done = subprocess.run(
        [sys.executable, "-m", "bubblescope.cli", "import-trace", *map(str, files), "--url", sqlite_server.url]
        + ["--run", f"imported-{job}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    for width in (1440, 900):
        page = browser.new_page(viewport={"width": width, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{sqlite_server.url}/runs/imported-{job}")
        source = page.locator("#run-source")
        expect(source).to_be_visible(timeout=20_000)
        assert all(path.name in source.inner_text() for path in files), source.inner_text()
        assert "torch.profiler (Kineto) traces" in source.inner_text() and "profiler steps" in source.inner_text()
        assert all(said in source.inner_text() for said in STACKS.get(job, ())), source.inner_text()
        expect(page.locator("#run-state .state")).to_have_text("finished")
        expect(page.locator("#run-facts")).to_contain_text(f"{WORLDS[job]} (traces)")
        options = page.locator("#step-select option").all_inner_texts()
        assert options and not any("partial" in o or "warm-up" in o for o in options), options
        expect(page.locator("#breakdown tbody tr").first).to_be_visible(timeout=20_000)
        page.screenshot(path=str(output_dir / f"imported-{job}-{width}.png"), full_page=True)
        assert errors == [], errors
        page.close()
