"""Real headless Chromium shows the stragglers heatmap and findings of a real job with a slow rank."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.dashboard.synthetic import gpipe_batch
from tests.stragglers.test_api_jobs import HOSTS, RANKS, SCORED, run_straggler_job, stragglers_when_complete
from tests.support import LiveServer, post_gzip

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timing]


def test_run_page_shows_the_heatmap_and_names_the_straggler(
    browser: Any,
    sqlite_server: LiveServer,
    output_dir: Path,
) -> None:
    job = run_straggler_job(sqlite_server.url, HOSTS, "--slow=3:1.6", "--slow=1:2.5@8-9")
    assert job.returncode == 0, job.output[-3000:]
    with sqlite_server.client() as client:
        stragglers_when_complete(client, job.run_key)
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{sqlite_server.url}/runs/{job.run_key}")
    page.wait_for_selector(f"body[data-stragglers-steps='{SCORED}']", timeout=20_000)
    page.wait_for_selector("#straggler-heatmap .heatmaplayer image, #straggler-heatmap .hm", timeout=10_000)
    rows = page.evaluate("() => document.getElementById('straggler-heatmap').data[0].y")
    assert rows == ["rank 0 · hA", "rank 1 · hA", "rank 2 · hB", "rank 3 · hB"]
    ringed = page.evaluate("() => document.getElementById('straggler-heatmap').data[1].y")
    assert ringed.count("rank 3 · hB") >= 8 and ringed.count("rank 1 · hA") in (2, 3)  # steps 8-9 (+ a possible hiccup)
    findings = page.locator("#straggler-findings li").all_inner_texts()
    assert any("rank 3 (host hB)" in f and "a persistent straggler" in f for f in findings), findings
    assert any("rank 1 (host hA)" in f and "a one-off slowdown" in f for f in findings), findings
    assert len(page.evaluate("() => document.getElementById('straggler-heatmap').data[0].z")) == RANKS
    page.locator("#straggler-heatmap").scroll_into_view_if_needed()
    page.screenshot(path=str(output_dir / "stragglers.png"), full_page=True)
    assert errors == []
    page.close()


def test_a_stage_slow_by_design_is_white_on_the_heat_map_and_no_straggler(
    browser: Any, sqlite_server: LiveServer, output_dir: Path
) -> None:
    """Two ranks, one stage each, the second doing 3x the work on every step: imbalance, which the analysis
    reports. The heat map colours each cell against the baseline its flag compares with (here each rank's own
    history), so the heavy stage is not painted red beside "No stragglers"."""
    key = f"imbalanced-{uuid.uuid4().hex[:8]}"
    with sqlite_server.client() as client:
        config = {"schedule": "GPipe", "num_stages": 2, "num_microbatches": 4}
        run = {"name": "imbalanced", "world_size": 2, "config": config}
        assert client.put(f"/api/v1/runs/{key}", json=run).status_code == 200
        for rank in range(2):
            worker = {"host": f"h{rank}", "pid": rank, "stage": rank}
            assert client.put(f"/api/v1/runs/{key}/ranks/{rank}", json=worker).status_code == 200
            batch = gpipe_batch(key, rank, 2, 4, range(12), slow=3.0 if rank == 1 else 1.0)
            assert post_gzip(client, batch).is_success
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{sqlite_server.url}/runs/{key}")
    page.wait_for_selector("body[data-drawn='true']", timeout=30_000)
    z = page.evaluate("() => document.getElementById('straggler-heatmap').data[0].z")
    assert len(z) == 2 and all(cell == pytest.approx(1.0, abs=0.05) for row in z for cell in row), z
    assert page.locator("#straggler-findings li").all_inner_texts() == [
        "No stragglers: every rank is within the thresholds."
    ]
    assert errors == []
    page.locator("#straggler-heatmap").scroll_into_view_if_needed()
    page.locator("#stragglers").screenshot(path=str(output_dir / "stragglers-imbalanced.png"))
    page.close()
