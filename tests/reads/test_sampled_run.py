"""A run past 2,048 ranks (8 stages × 264 replicas = 2,112, 1F1B, rank 1,409 computing 1.3× its peers)
sent through the HTTP API: its step reads the spans of a sample of whole replicas (analysis/sampling.py),
the other ranks' breakdowns come from their step aggregates, and the slow rank is still what the step,
the breakdown and the analysis name. Timings are measured by bench/scale.py, not here."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bubblescope.analysis.sampling import SAMPLE_REPLICAS, SPANS_OF_EVERY_RANK_UP_TO
from bubblescope.analysis.stragglers import MIN_VERDICT_STEPS
from bubblescope.synthetic_run import SyntheticJob, register_job, send_job
from tests.support import LiveServer

pytestmark = pytest.mark.slow
SLOW_RANK = 1409  # stage 1 of replica 176
JOB = SyntheticJob(stages=8, replicas=264, steps=2, full_every=1, slow=((SLOW_RANK, 1.3),))
STEP = 1


@pytest.fixture(scope="module")
def sampled_run(server: LiveServer) -> Iterator[tuple[LiveServer, str]]:
    assert JOB.world_size > SPANS_OF_EVERY_RANK_UP_TO
    key = f"sampled-{uuid.uuid4().hex[:8]}"
    with server.client() as client:
        client.timeout = 120
        register_job(client, JOB, key, senders=4)
        send_job(client, JOB, key, steps_per_batch=JOB.steps, senders=4)
    yield server, key


def _step(sampled_run: tuple[LiveServer, str], **params: object) -> dict[str, Any]:
    server, key = sampled_run
    with server.client() as client:
        client.timeout = 120
        response = client.get(f"/api/v1/runs/{key}/steps/{STEP}", params=params)
        assert response.status_code == 200, response.text[:500]
        answer: dict[str, Any] = response.json()
        return answer


def test_the_step_reads_whole_replicas_and_sums_the_others_from_their_aggregates(
    sampled_run: tuple[LiveServer, str],
) -> None:
    detail = _step(sampled_run)
    assert detail["breakdown_ranks"] == len(detail["breakdown"]) == JOB.world_size
    measured = {b["rank"] for b in detail["breakdown"] if b["from_spans"]}
    assert len(measured) == detail["span_sample_ranks"] and len(measured) % JOB.stages == 0
    assert SAMPLE_REPLICAS * JOB.stages <= len(measured) <= (SAMPLE_REPLICAS + 2 * JOB.stages) * JOB.stages
    replicas = {JOB.replica_of(r) for r in measured}
    assert all(JOB.replica_of(r) in replicas for r in measured) and len(replicas) * JOB.stages == len(measured)
    assert SLOW_RANK in measured
    by_rank = {b["rank"]: b for b in detail["breakdown"]}
    for b in detail["breakdown"]:  # the same identities whichever way a row was measured
        assert b["compute_ns"] + b["exposed_comm_ns"] + b["idle_ns"] == pytest.approx(b["window_ns"], abs=1000)
        assert b["dependency_wait_ns"] + b["transfer_ns"] == b["exposed_comm_ns"]
    # a summed rank and a measured rank of the same stage read alike (the peers compute within ±2%)
    stage_of = {b["rank"]: b["stage"] for b in detail["breakdown"]}
    summed = next(r for r in by_rank if r not in measured and stage_of[r] == 3)
    twin = next(r for r in measured if stage_of[r] == 3 and r != summed)
    assert by_rank[summed]["compute_ns"] == pytest.approx(by_rank[twin]["compute_ns"], rel=0.1)
    assert by_rank[summed]["bubble_fraction"] == pytest.approx(by_rank[twin]["bubble_fraction"], abs=0.1)
    shown = detail["timeline_ranks"]
    assert {"rank": SLOW_RANK, "stage": 1, "role": f"slowest of {JOB.replicas}"} in shown
    assert {span["rank"] for span in detail["spans"]} == {r["rank"] for r in shown}


def test_a_rank_outside_the_sample_can_be_asked_for_and_the_breakdown_lists_the_slowest(
    sampled_run: tuple[LiveServer, str],
) -> None:
    measured = {b["rank"] for b in _step(sampled_run)["breakdown"] if b["from_spans"]}
    outside = next(r for r in range(JOB.world_size) if r not in measured)
    detail = _step(sampled_run, ranks=f"{outside},{SLOW_RANK}")
    spans = {span["rank"] for span in detail["spans"]}
    assert spans == {outside, SLOW_RANK}
    listed = _step(sampled_run, breakdown_limit=10)["breakdown"]
    assert len(listed) == 10 and listed[0]["rank"] == SLOW_RANK
    assert [b["compute_ns"] for b in listed] == sorted((b["compute_ns"] for b in listed), reverse=True)


def test_the_analysis_of_a_sampled_step_names_the_slow_rank(sampled_run: tuple[LiveServer, str]) -> None:
    """The straggler view names the slow rank from these 2 steps; the analysis offers no host to drain on
    so few (a suggestion needs ``MIN_VERDICT_STEPS`` analysed steps, as the straggler alert does)."""
    server, key = sampled_run
    with httpx.Client(base_url=server.url, timeout=120) as client:
        response = client.get(f"/api/v1/runs/{key}/analysis")
        stragglers = client.get(f"/api/v1/runs/{key}/stragglers").json()
    assert response.status_code == 200, response.text[:500]
    analysis = response.json()
    assert any(SLOW_RANK in f["ranks"] and f["verdict"] == "persistent" for f in stragglers["findings"]), stragglers[
        "findings"
    ]
    assert JOB.steps < MIN_VERDICT_STEPS
    assert not [s for s in analysis["suggestions"] if s["kind"] == "drain_straggler"], analysis["suggestions"]
    assert analysis["pipeline"] is not None, analysis["pipeline_unavailable"]  # replayed from the sampled replicas
    assert all(0.0 < fraction < 1.0 for fraction in analysis["step_bubble_fractions"])
    assert analysis["exposed_comm_ns_by_group"]["dp"] > 0  # per sampled rank, not diluted by the others


@pytest.mark.browser
def test_the_heat_map_folds_each_stages_ranks_and_the_slow_ranks_row_is_the_reddest(
    sampled_run: tuple[LiveServer, str], browser: Any, output_dir: Path
) -> None:
    """Past 1,024 ranks a heat-map row is the slowest of a run of one stage's ranks (frontend/heatmap_rows.js):
    2,112 rows of under half a pixel would hide the slow rank."""
    server, key = sampled_run
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.goto(f"{server.url}/runs/{key}")
    page.wait_for_selector("body[data-drawn='true']", timeout=120_000)
    heat = page.evaluate(
        "() => { const [cells, rings] = document.getElementById('straggler-heatmap').data;"
        " return { y: cells.y, z: cells.z, text: cells.text, ringed: rings.y }; }"
    )
    size = -(-JOB.world_size // 256)  # ranks per folded row
    assert len(heat["y"]) == JOB.stages * -(-JOB.replicas // size) < JOB.world_size
    assert heat["y"][0].startswith("stage 0 · ranks 0–") and heat["y"][-1].startswith("stage 7 · ranks ")
    slow_row = max(range(len(heat["z"])), key=lambda r: min(heat["z"][r]))  # the reddest row on every step
    assert heat["y"][slow_row].startswith("stage 1 · ")
    assert all(z == pytest.approx(1.3, abs=0.1) for z in heat["z"][slow_row])
    assert all(f"slowest: rank {SLOW_RANK}" in text for text in heat["text"][slow_row])
    others = [max(row) for r, row in enumerate(heat["z"]) if r != slow_row]
    assert max(others) < 1.15  # every other row holds peers within the ±2% noise
    assert heat["y"][slow_row] in heat["ringed"]
    assert errors == []
    page.locator("#straggler-heatmap").scroll_into_view_if_needed()
    page.locator("#stragglers").screenshot(path=str(output_dir / "heatmap-2112-ranks.png"))
    page.close()


def test_the_run_answer_lists_the_ranks_asked_for_failed_ones_first(sampled_run: tuple[LiveServer, str]) -> None:
    """Last in the module: it ends a rank."""
    server, key = sampled_run
    with server.client() as client:
        client.timeout = 120
        ended = client.put(f"/api/v1/runs/{key}/ranks/2000/end", json={"outcome": "failed", "error": "OOM"})
        assert ended.status_code == 200, ended.text[:300]
        run = client.get(f"/api/v1/runs/{key}", params={"ranks_limit": 100}).json()
        every = client.get(f"/api/v1/runs/{key}").json()
    listed = [r["rank"] for r in run["ranks"]]
    assert run["rank_count"] == every["rank_count"] == len(every["ranks"]) == JOB.world_size
    assert len(listed) == 100 and listed == sorted(listed) and 2000 in listed  # the failed rank, then the lowest
    assert listed[:99] == list(range(99))
    assert run["dropped_spans"] == every["dropped_spans"] == sum(r["dropped_spans"] for r in every["ranks"])
    assert run["steps"] == every["steps"] and run["state"] == every["state"]
