"""The run page of a two-rank DDP run whose compute-slow rank waits for a late one (the analysis' case in
tests/analysis/test_waiting_straggler.py, fed through the API): in headless Chromium the first line and the Slowest
card name rank 1, the rank the other waits for, not rank 0 whose compute is 1.2× (a tour run once led with
"Rank 0 of 2 is persistently slow ... Do first: Find why rank 1 arrives late"); with rank 1 on time, rank 0 leads."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from bubblescope import wire
from tests.analysis.test_waiting_straggler import HOST_WORK, rank_spans
from tests.support import LiveServer, post_gzip

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timing]
STEPS = range(22)


def feed(client: httpx.Client, host_work_ms: int) -> str:
    key = f"waiting-straggler-{host_work_ms}-{uuid.uuid4().hex[:6]}"
    response = client.put(f"/api/v1/runs/{key}", json={"name": "ddp-late-rank", "world_size": 2, "config": {}})
    assert response.status_code == 200, response.text
    for rank in range(2):
        response = client.put(f"/api/v1/runs/{key}/ranks/{rank}", json={"host": f"host{rank}", "pid": rank})
        assert response.status_code == 200, response.text
    for rank in range(2):
        rows, aggregates = [], []
        for step in STEPS:
            spans, (start, end) = rank_spans(rank, step, host_work_ms)
            compute = sum(s.end_ns - s.start_ns for s in spans if s.kind != "all_reduce")
            comm = sum(s.end_ns - s.start_ns for s in spans if s.kind == "all_reduce")
            aggregates.append(
                {
                    "step": step,
                    "start_ns": start,
                    "end_ns": end,
                    "compute_ns": compute,
                    "comm_ns": comm,
                    "exposed_comm_ns": comm,
                    "idle_ns": end - start - compute - comm,
                    "span_count": len(spans),
                }
            )
            rows += [(step, s.kind, s.start_ns, s.end_ns, None, None, None, None, s.group, s.name) for s in spans]
        batch = {"run_key": key, "rank": rank, "seq": 0, "steps": aggregates, "spans": wire.spans_to_columns(rows)}
        response = post_gzip(client, batch)
        assert response.is_success, response.text
    return key


@pytest.mark.parametrize("host_work_ms,leader", [(HOST_WORK, 1), (0, 0)])
def test_the_first_line_names_the_rank_the_others_wait_for(
    browser: Any, sqlite_server: LiveServer, output_dir: Path, host_work_ms: int, leader: int
) -> None:
    with sqlite_server.client() as client:
        key = feed(client, host_work_ms)
        findings = client.get(f"/api/v1/runs/{key}/stragglers").json()["findings"]
    assert findings and findings[0]["ranks"] == [0] and findings[0]["verdict"] == "persistent", findings
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    try:
        page.goto(f"{sqlite_server.url}/runs/{key}")
        page.wait_for_selector("body[data-drawn='true']", timeout=60_000)
        line = page.locator("#glance-verdict").inner_text()
        slowest = page.locator("#glance-slowest .value").inner_text()
        page.screenshot(path=str(output_dir / f"waiting-straggler-{host_work_ms}.png"))
    finally:
        page.close()
    if leader == 1:  # rank 0 waits 130 − 36 = 94 ms a step for rank 1
        assert re.search(r"^Rank 1 is late to the collectives: each of its peers waits 9\d\.\d ms", line), line
    else:  # rank 1 waits 36 − 30 = 6 ms for rank 0, which computes (12 + 24 + 2) / (10 + 20 + 2) = 1.19× as long
        assert line.startswith("Rank 0 of 2 is persistently slow: 1.19×"), line
    assert slowest == f"rank {leader}", slowest
