"""A 1,024-rank run (8 stages × 128 data-parallel replicas, 1F1B, rank 341 computing 1.3× its peers)
sent through the HTTP API as the collector sends it, on SQLite and PostgreSQL: every request of the
run page answers, each under 1 MB on the wire, and the slow rank is what the step view, the stragglers
and the analysis name. Timings are measured by bench/scale.py, not here."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bubblescope.synthetic_run import SyntheticJob, register_job, send_job
from tests.support import LiveServer

SLOW_RANK = 341  # stage 5 of replica 42
JOB = SyntheticJob(stages=8, replicas=128, steps=16, full_every=5, slow=((SLOW_RANK, 1.3),))
SHOWN_STEP = 10
WIRE_LIMIT = 1_000_000
PAGE_ROWS = 32  # frontend/breakdown.js


@dataclass(frozen=True)
class BigRun:
    server: LiveServer
    key: str


@pytest.fixture(scope="module")
def big_run(server: LiveServer) -> Iterator[BigRun]:
    key = f"big-{uuid.uuid4().hex[:8]}"
    with server.client() as client:
        client.timeout = 120
        register_job(client, JOB, key, senders=4)
        send_job(client, JOB, key, steps_per_batch=JOB.steps, senders=4)
    yield BigRun(server, key)


def _get(run: BigRun, path: str, **params: object) -> tuple[object, int]:
    with run.server.client() as client:
        client.timeout = 120
        response = client.get(f"/api/v1/runs/{run.key}{path}", params=params, headers={"Accept-Encoding": "gzip"})
        assert response.status_code == 200, response.text[:500]
        return response.json(), response.num_bytes_downloaded


def test_the_run_and_its_steps_are_summed_for_every_rank(big_run: BigRun) -> None:
    run, size = _get(big_run, "")
    assert isinstance(run, dict) and size < WIRE_LIMIT
    assert len(run["ranks"]) == JOB.world_size and len(run["steps"]) == JOB.steps
    assert all(step["ranks_reported"] == JOB.world_size for step in run["steps"])
    assert [s["step"] for s in run["steps"] if s["has_spans"]] == [0, 5, 10, 15]


def test_the_step_view_folds_replicas_to_each_stages_median_and_slowest_rank(big_run: BigRun) -> None:
    detail, size = _get(big_run, f"/steps/{SHOWN_STEP}")
    assert isinstance(detail, dict) and size < WIRE_LIMIT
    assert len(detail["breakdown"]) == JOB.world_size
    shown = detail["timeline_ranks"]
    assert len(shown) == 2 * JOB.stages
    slowest = [r for r in shown if r["role"] == f"slowest of {JOB.replicas}"]
    assert {"rank": SLOW_RANK, "stage": 5, "role": f"slowest of {JOB.replicas}"} in slowest
    assert {span["rank"] for span in detail["spans"]} == {r["rank"] for r in shown}


def test_any_ranks_can_be_asked_for_and_too_many_are_refused(big_run: BigRun) -> None:
    detail, _ = _get(big_run, f"/steps/{SHOWN_STEP}", ranks="0-3,341")
    assert isinstance(detail, dict)
    assert {span["rank"] for span in detail["spans"]} == {0, 1, 2, 3, SLOW_RANK}
    with big_run.server.client() as client:
        refused = client.get(f"/api/v1/runs/{big_run.key}/steps/{SHOWN_STEP}", params={"ranks": "0-1023"})
        assert refused.status_code == 422 and "ranks" in refused.text and "at most 64" in refused.text


def test_the_stragglers_and_the_analysis_name_the_slow_rank(big_run: BigRun) -> None:
    view, size = _get(big_run, "/stragglers", phases="compute")
    assert isinstance(view, dict) and size < WIRE_LIMIT
    assert len(view["ranks"]) == JOB.world_size
    assert [(f["kind"], f["ranks"], f["verdict"]) for f in view["findings"]] == [
        ("slow rank", [SLOW_RANK], "persistent")
    ]
    analysis, size = _get(big_run, "/analysis")
    assert isinstance(analysis, dict) and size < WIRE_LIMIT
    top = analysis["suggestions"][0]
    assert f"rank {SLOW_RANK}" in top["title"] + top["evidence"], top


def test_the_compact_stragglers_answer_carries_the_heat_maps_ratios_and_flags_in_a_fraction_of_the_bytes(
    big_run: BigRun,
) -> None:
    full, _ = _get(big_run, "/stragglers", phases="compute")
    compact, _ = _get(big_run, "/stragglers", phases="compute", compact="true")
    assert isinstance(full, dict) and isinstance(compact, dict)
    matrix, small = full["matrices"]["compute"], compact["matrices"]["compute"]
    assert small["values_ns"] is None and small["ratio_to_step_median"] is None and compact["flagged"] is None
    assert compact["ratio_to_baseline"] == full["ratio_to_baseline"]  # the heat map's colour
    assert small["step_median_ns"] == matrix["step_median_ns"]
    cells = [(i, j) for i, row in enumerate(full["flagged"]) for j, hit in enumerate(row) if hit]
    assert cells and compact["flagged_cells"] == full["flagged_cells"] == [list(cell) for cell in cells]
    assert {i for i, _ in cells} == {full["ranks"].index(SLOW_RANK)}
    row = compact["ratio_to_baseline"][full["ranks"].index(SLOW_RANK)]
    assert all(ratio == pytest.approx(1.3, abs=0.05) for ratio in row)  # against its stage peers
    assert compact["rank_scores"] == [s for s in full["rank_scores"] if s["verdict"] != "normal"]
    assert SLOW_RANK in [s["rank"] for s in compact["rank_scores"]]
    assert compact["hosts"] == full["hosts"] == [s["host"] for s in full["rank_scores"]]
    assert compact["stages"][SLOW_RANK] == 5 and compact["findings"] == full["findings"]
    full_bytes, compact_bytes = len(json.dumps(full)), len(json.dumps(compact))
    print(
        f"stragglers JSON at {JOB.world_size} ranks x {JOB.steps} steps: {full_bytes:,} full, {compact_bytes:,} compact"
    )
    assert compact_bytes < full_bytes / 2


@pytest.mark.browser
@pytest.mark.parametrize("width", [1440, 900])
def test_the_run_page_draws_every_card_and_its_first_screen_names_the_slow_rank(
    big_run: BigRun, browser: Any, output_dir: Path, width: int
) -> None:
    page = browser.new_page(viewport={"width": width, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.goto(f"{big_run.server.url}/runs/{big_run.key}")
    page.wait_for_selector("body[data-drawn='true']", timeout=90_000)
    slowest = page.locator("#glance-slowest")
    assert f"rank {SLOW_RANK}" in slowest.inner_text()
    assert slowest.bounding_box()["y"] < 1000  # on the first screen
    assert f"rank {SLOW_RANK}" in page.locator("#glance-do").inner_text()
    # the replicas of the slow rank's stage wait for it in the gradient all-reduce: bubble, above the floor
    bubble = page.locator("#glance-bubble").inner_text()
    assert "median of " in bubble and "pts above its floor" in bubble, bubble
    rows = page.evaluate("() => [...new Set(document.getElementById('timeline').data.flatMap((t) => t.y))]")
    assert f"rank {SLOW_RANK} · stage 5 · slowest of {JOB.replicas}" in rows and len(rows) == 2 * JOB.stages
    # ~1,400 bars a few pixels wide: drawn without micro-batch numbers (plotly measures each one)
    assert page.evaluate("() => document.getElementById('timeline').data.every((t) => !t.text)")
    assert page.locator("#breakdown tbody tr").count() == PAGE_ROWS
    assert page.locator("#breakdown tbody tr td").first.inner_text() == f"rank {SLOW_RANK}"  # slowest first
    assert page.evaluate("() => document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    assert errors == []
    page.screenshot(path=str(output_dir / f"run-page-1024-ranks-{width}.png"), full_page=True)
    page.close()
