"""GET /runs/{key}/analysis and POST /runs/{key}/whatif on a real job, on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

from tests.analysis.replay_support import JobShape, run_and_analyse
from tests.support import LiveServer

pytestmark = [pytest.mark.slow, pytest.mark.timing]


@pytest.fixture(scope="module")
def analysed(server: LiveServer) -> tuple[str, dict[str, Any]]:
    return run_and_analyse(
        server.url, server.client(), JobShape("1f1b", 4, (3, 1), microbatch_size=64, hidden=768, steps=5)
    )


def test_analysis_attributes_the_bubble_and_describes_the_pipeline(
    server: LiveServer, analysed: tuple[str, dict[str, Any]]
) -> None:
    _, analysis = analysed
    assert analysis["steps"] == [1, 2, 3, 4]  # step 0 (warm-up) left out
    pipeline = analysis["pipeline"]["setup"]
    assert pipeline["schedule"] == "1f1b" and pipeline["ranks"] == 2 and pipeline["microbatches"] == 4
    costs = [c["forward_ns"] + c["backward_ns"] for c in pipeline["stage_costs"]]
    assert costs[0] > costs[1]  # three layers against one
    attribution = analysis["attribution"]
    # identities (the last cause and idle are remainders); test_injected_delays.py checks the figures
    assert sum(c["ns"] for c in attribution["causes"]) == pytest.approx(attribution["measured_bubble_ns"])
    assert attribution["closed_form_fraction"] == pytest.approx(1 / 5)
    assert [s["stage"] for s in analysis["stages"]] == [0, 1]
    for stage in analysis["stages"]:
        parts = stage["compute_ns"] + stage["exposed_comm_ns"] + stage["idle_ns"]
        assert parts == pytest.approx(stage["window_ns"], rel=1e-6)
    # the job declares no layer split: the collector counted each stage module's Linear layers
    assert analysis["imbalance"]["layers_per_stage"] == [3, 1] and analysis["layers_source"] == "counted"
    assert analysis["params_per_stage"] == [3 * (768 * 768 + 768), 768 * 768 + 768]
    excess = analysis["imbalance"]["excess_ns"]
    assert excess == pytest.approx(costs[0] - sum(costs) / 2, rel=1e-6)


def test_analysis_shows_memory_per_stage_from_each_rank_s_own_readings(
    server: LiveServer, analysed: tuple[str, dict[str, Any]]
) -> None:
    """The job's processes read their peak resident set each step and registered their share of the host's memory."""
    key, analysis = analysed
    ranks = server.client().get(f"/api/v1/runs/{key}").json()["ranks"]
    limits = {r["rank"]: r["memory_limit_bytes"] for r in ranks}
    assert all(limit and limit > 2**28 for limit in limits.values()), limits
    memory = analysis["memory"]
    assert [(m["stage"], m["ranks"], m["source"]) for m in memory] == [(0, 1, "host_rss"), (1, 1, "host_rss")]
    for row in memory:  # a torch process: more than 50 MiB, less than what it may use
        assert 50 * 2**20 < row["peak_bytes"] < row["limit_bytes"] == limits[row["peak_rank"]]
        assert row["fraction_of_limit"] == pytest.approx(row["peak_bytes"] / row["limit_bytes"])
        assert row["predicted_bytes"] is None  # no model declared
    assert sum(m["nearest_limit"] for m in memory) == 1


def test_whatif_replays_another_configuration(server: LiveServer, analysed: tuple[str, dict[str, Any]]) -> None:
    key, _analysis = analysed
    client = server.client()
    more = client.post(f"/api/v1/runs/{key}/whatif", json={"microbatches": 8}).json()
    gpipe = client.post(f"/api/v1/runs/{key}/whatif", json={"schedule": "gpipe", "microbatches": 8}).json()
    assert more["step_ns"] > more["measured_step_ns"]  # twice the work per step
    assert gpipe["peak_activations"] == 8 and more["peak_activations"] == 2
    # 8 micro-batches of today's size: twice the samples, which the answer says
    assert more["samples_per_step_ratio"] == pytest.approx(2) and not more["global_batch_held"]
    held = client.post(f"/api/v1/runs/{key}/whatif", json={"microbatches": 8, "microbatch_scale": 0.5}).json()
    assert held["samples_per_step_ratio"] == pytest.approx(1) and held["global_batch_held"]
    same = client.post(f"/api/v1/runs/{key}/whatif", json={}).json()
    # the fitted per-action overhead makes this so; a what-if checked against an injected delay:
    # test_injected_delays.py
    assert same["step_ns"] == pytest.approx(same["measured_step_ns"], rel=1e-3)
    moved = client.post(f"/api/v1/runs/{key}/whatif", json={"layers_per_stage": [1, 3]}).json()
    assert moved["layers_per_stage"] == [1, 3]
    assert moved["idle_ns_per_rank"] != same["idle_ns_per_rank"]  # the heavy stage moved to rank 1


@pytest.mark.parametrize(
    "body,loc",
    [
        ({"schedule": "zigzag"}, ["body", "schedule"]),
        ({"layers_per_stage": [1, 1]}, ["body", "layers_per_stage"]),
        ({"microbatches": 0}, ["body", "microbatches"]),
        ({"stages_per_rank": 3, "schedule": "zbv"}, ["body", "stages_per_rank"]),
        ({"surprise": 1}, ["body", "surprise"]),
    ],
)
def test_whatif_errors_name_the_field(
    server: LiveServer, analysed: tuple[str, dict[str, Any]], body: dict[str, Any], loc: list[str]
) -> None:
    key, _ = analysed
    response = server.client().post(f"/api/v1/runs/{key}/whatif", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == loc


def test_analysis_range_errors(server: LiveServer, analysed: tuple[str, dict[str, Any]]) -> None:
    key, _ = analysed
    client = server.client()
    reversed_range = client.get(f"/api/v1/runs/{key}/analysis", params={"from_step": 4, "to_step": 2})
    assert reversed_range.status_code == 422 and reversed_range.json()["detail"][0]["loc"] == ["query", "from_step"]
    assert client.get(f"/api/v1/runs/{key}/analysis", params={"from_step": 999}).status_code == 404
    assert client.get("/api/v1/runs/no-such-run/analysis").status_code == 404
    one_step = client.get(f"/api/v1/runs/{key}/analysis", params={"from_step": 2, "to_step": 2}).json()
    assert one_step["steps"] == [2]
