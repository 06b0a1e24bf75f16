"""Every way of splitting a model, as real gloo jobs: layer-wise model parallelism, DDP,
FSDP2, tensor parallelism, raw collectives, and 2-D / 3-D hybrid meshes."""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

import pytest

from tests.support import LiveServer, run_parallel_job, wait_for_steps

pytestmark = pytest.mark.slow
STEPS = 3
HIDDEN, BATCH, LAYERS = 64, 16, 2  # parallel_job.py defaults
FLOAT = 4
JOBS = {  # name -> (mode, processes, extra arguments)
    "collectives": ("collectives", 2, ()),
    # Enough work per stage (a few ms) that the bubble is the schedule's, not gloo's latency.
    "naive": ("naive", 2, ("--batch=512", "--layers=4")),
    "naive-bf16": ("naive", 2, ("--batch=512", "--layers=4", "--bf16")),
    "ddp": ("ddp", 2, ("--layers=4",)),
    "ddp-bf16": ("ddp", 2, ("--layers=4", "--bf16")),
    "fsdp": ("fsdp", 2, ()),
    "tp": ("tp", 2, ()),
    "compiled": ("compiled", 2, ()),
    "hybrid2d": ("hybrid2d", 4, ()),
    "hybrid3d": ("hybrid3d", 8, ()),
}
# The layer-wise bubble check needs one step where rank 1 reached its recv before rank 0's send;
# on a loaded 2-core machine rank 1 can arrive late in two steps running (seen in CI), so more steps.
STEPS_OF = {"naive": 6, "naive-bf16": 6, "hybrid2d": 5}  # hybrid2d: 4 steps past its first, for a fix to be priced


@pytest.fixture(scope="module")
def layouts(sqlite_server: LiveServer) -> dict[str, tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Per job: the run detail and the detail of every step after the first."""
    results = {}
    with sqlite_server.client() as client:
        for name, (mode, nproc, args) in JOBS.items():
            count = STEPS_OF.get(name, STEPS)
            job = run_parallel_job(sqlite_server.url, mode, nproc, f"--steps={count}", *args)
            assert job.returncode == 0, (name, job.output[-3000:])
            detail = wait_for_steps(client, job.run_key, ranks=nproc, steps=count)
            steps = [client.get(f"/api/v1/runs/{job.run_key}/steps/{s}").json() for s in range(1, count)]
            results[name] = (detail, steps)
            said = [line for line in job.output.splitlines() if "bubblescope:" in line and "streams to" not in line]
            assert said == [], (name, job.output[-3000:])  # no collector warning (rank 0 names the run's page)
    return results


def spans_of(step: dict[str, Any], rank: int, kind: str | None = None) -> list[dict[str, Any]]:
    return [s for s in step["spans"] if s["rank"] == rank and (kind is None or s["kind"] == kind)]


def test_every_collective_and_p2p_call_is_a_span_with_bytes_peer_and_group(layouts: dict) -> None:
    n, world = 1024 * FLOAT, 2
    expected = {  # name -> (kind, bytes): the full (unsharded) buffer of each call
        "all_reduce": ("all_reduce", n),
        "all_gather": ("all_gather", n * world),
        "all_gather_into_tensor": ("all_gather", n * world),
        "reduce_scatter": ("reduce_scatter", n * world),
        "reduce_scatter_tensor": ("reduce_scatter", n * world),
        "all_to_all": ("all_to_all", n * world),
        "all_to_all_single": ("all_to_all", n * world),
        "broadcast": ("broadcast", n),
        "send": ("send", n),
        "recv": ("recv", n),
    }
    _detail, steps = layouts["collectives"]
    for step in steps:
        for rank in range(world):
            spans = spans_of(step, rank)
            by_name = Counter(s["name"] for s in spans)
            for name, (kind, size) in expected.items():
                matching = [s for s in spans if s["name"] == name]
                assert matching and all(s["kind"] == kind and s["bytes"] == size for s in matching), (name, matching)
            assert by_name["all_reduce"] == 2  # blocking and async_op=True
            assert by_name["isend" if rank == 0 else "irecv"] == 1
            assert Counter(s["kind"] for s in spans if s["name"] == "batch_isend_irecv") == {"send": 1, "recv": 1}
            assert all(s["group"] == "world" for s in spans)
            assert all(s["peer"] == 1 - rank for s in spans if s["kind"] in ("send", "recv"))
            assert [s["peer"] for s in spans if s["kind"] == "broadcast"] == [0]
            assert all(s["end_ns"] >= s["start_ns"] for s in spans)


@pytest.mark.parametrize("name", ["naive", "naive-bf16"])
def test_layerwise_model_parallelism_shows_its_bubble(layouts: dict, name: str) -> None:
    """Two ranks, no micro-batches: each waits for the other's forward or backward. The helper's
    recv spans let the service count that wait as bubble: (p-1)/p = 0.5 in theory."""
    detail, steps = layouts[name]
    assert detail["config"]["schedule"] == "naive" and detail["config"]["num_stages"] == 2
    for step in steps:
        for rank in range(2):
            kinds = Counter((s["kind"], s.get("name")) for s in spans_of(step, rank) if s["stage"] == rank)
            peer_name = ("fwd", "bwd") if rank == 0 else ("bwd", "fwd")
            assert kinds[("forward", None)] == kinds[("backward", None)] == 1, kinds
            assert kinds[("send", peer_name[0])] == kinds[("recv", peer_name[1])] == 1, kinds
        assert step["bubble"]["theoretical_fraction"] == pytest.approx(0.5)
    # 0.4-0.6 per step on this machine, idle or loaded (optimizer and data loading are outside the
    # ping-pong); counted as transfer instead, the recv waits would leave almost nothing. One step of
    # five fell to 0.12 in a fresh-clone CI under two workers, so the check is on the median step, the
    # step the service reports (analysis.attribution, run_report).
    fractions = [step["bubble"]["measured_fraction"] for step in steps]
    assert statistics.median(fractions) > 0.15, fractions
    # Each rank waits for the other: rank 1's recv for rank 0's forward, rank 0's recv for rank 1's
    # forward and backward. A rank descheduled on a loaded 2-core machine can reach its recv after the
    # peer's send (a CI run saw rank 1 do so on all 5 steps while other tests ran beside it), so each
    # step asks that one of the two waited, not which.
    waits = [[b["dependency_wait_ns"] for b in step["breakdown"]] for step in steps]
    print(f"{name}: dependency waits per step, ranks 0 and 1 (ms): {[[w / 1e6 for w in ws] for ws in waits]}")
    assert all(max(ws) > 0 for ws in waits), waits


@pytest.mark.parametrize("name", ["ddp", "ddp-bf16"])
def test_ddp_gradient_all_reduce_is_recorded_bucket_by_bucket(layouts: dict, name: str) -> None:
    parameter_bytes = 4 * (HIDDEN * HIDDEN + HIDDEN) * FLOAT  # --layers=4, fp32 gradients
    _detail, steps = layouts[name]
    for step in steps:
        for rank in range(2):
            buckets = [s for s in spans_of(step, rank, "all_reduce") if s["name"].startswith("ddp_bucket_")]
            assert len(buckets) >= 2, buckets  # bucket_cap_mb=0.01: several buckets
            assert len({s["name"] for s in buckets}) == len(buckets)
            assert sum(s["bytes"] for s in buckets) == parameter_bytes
            assert {s["group"] for s in buckets} == {"world"}
            assert len(spans_of(step, rank, "optimizer")) == 1
            assert len(spans_of(step, rank, "data_loading")) == 1


def test_bf16_autocast_changes_nothing_in_what_is_recorded(layouts: dict) -> None:
    """Same spans, bytes, peers and groups with and without autocast. DDP's buckets are rebuilt
    in gradient-ready order, which autocast may change, so they compare by their total."""

    def shape(step: dict[str, Any]) -> Counter:
        return Counter(
            (s["rank"], s["kind"], s["name"], s["bytes"], s["peer"], s["group"])
            for s in step["spans"]
            if s["bytes"] != 0 and not (s["name"] or "").startswith("ddp_bucket_")
        )

    def bucket_bytes(step: dict[str, Any]) -> dict[int, int]:
        return {r: sum(s["bytes"] for s in spans_of(step, r, "all_reduce")) for r in range(2)}

    for plain, mixed in (("ddp", "ddp-bf16"), ("naive", "naive-bf16")):
        for step_plain, step_mixed in zip(layouts[plain][1], layouts[mixed][1]):
            assert shape(step_plain) == shape(step_mixed), (plain, mixed)
            assert bucket_bytes(step_plain) == bucket_bytes(step_mixed), (plain, mixed)


def test_fsdp2_all_gathers_and_reduce_scatters_each_unit(layouts: dict) -> None:
    unit_bytes = (HIDDEN * HIDDEN + HIDDEN) * FLOAT  # one fully_shard'ed block, unsharded
    _detail, steps = layouts["fsdp"]
    for step in steps:
        for rank in range(2):
            gathers = spans_of(step, rank, "all_gather")
            scatters = spans_of(step, rank, "reduce_scatter")
            assert len(gathers) == 2 * LAYERS  # forward, then again for backward (resharded)
            assert len(scatters) == LAYERS
            assert {s["bytes"] for s in gathers} == {s["bytes"] for s in scatters} == {unit_bytes}


def test_tensor_parallel_collectives_carry_the_tp_group(layouts: dict) -> None:
    detail, steps = layouts["tp"]
    assert [r["coords"] for r in detail["ranks"]] == [{"tp": 0}, {"tp": 1}]
    for step in steps:
        for rank in range(2):
            reduces = spans_of(step, rank, "all_reduce")
            assert reduces and {s["group"] for s in reduces} == {"tp"}
            assert {s["bytes"] for s in reduces} == {BATCH * HIDDEN * FLOAT}  # the row-wise output


@pytest.mark.parametrize("name,shape", [("hybrid2d", {"dp": 2, "pp": 2}), ("hybrid3d", {"dp": 2, "tp": 2, "pp": 2})])
def test_hybrid_meshes_record_coordinates_and_span_groups(layouts: dict, name: str, shape: dict[str, int]) -> None:
    detail, steps = layouts[name]
    names = list(shape)
    for info in detail["ranks"]:
        coords, rank = info["coords"], info["rank"]
        expected, rest = {}, rank
        for dim in reversed(names):  # row-major mesh: the last dimension varies fastest
            expected[dim], rest = rest % shape[dim], rest // shape[dim]
        assert coords == expected, (rank, coords)
        assert info["stages"] == [coords["pp"]]
        assert info["host"]
    coords = {info["rank"]: info["coords"] for info in detail["ranks"]}
    for step in steps:
        comm = [s for s in step["spans"] if s["kind"] not in ("forward", "backward", "optimizer", "data_loading")]
        assert {s["group"] for s in comm} == set(names), Counter(s["group"] for s in comm)
        for span in comm:
            if span["group"] == "pp":  # pipeline neighbours: same replica (and TP shard), other stage
                mine, theirs = coords[span["rank"]], coords[span["peer"]]
                assert {k: v for k, v in mine.items() if k != "pp"} == {k: v for k, v in theirs.items() if k != "pp"}
                assert mine["pp"] != theirs["pp"]


def test_a_dp_x_pp_job_s_exposed_gradient_reduction_is_named_with_its_cost(
    layouts: dict, sqlite_server: LiveServer
) -> None:
    """The hybrid job all-reduces every gradient over "dp" after the pipeline, with nothing to hide it
    under: the analysis names dp's exposed communication per step (pipeline P2P is in the bubble, not
    here) and the suggestion to overlap it says that figure and predicts the step without it."""
    detail, _steps = layouts["hybrid2d"]
    # from step 1: past the 5-step warm-up none is left, and a fix is priced on 3 steps or more
    analysis = sqlite_server.client().get(f"/api/v1/runs/{detail['key']}/analysis", params={"from_step": 1}).json()
    assert analysis["advice_withheld"] is None, analysis["steps"]
    exposed = analysis["exposed_comm_ns_by_group"]
    assert exposed.get("dp", 0) > 0 and "pp" not in exposed, exposed
    dp = exposed["dp"]
    # the replicas' waits for each other in that all-reduce are a cause of their own, not straggler/jitter
    causes = {c["name"]: c["ns"] for c in analysis["attribution"]["causes"]}
    assert causes["mesh_collective_wait"] > 0, causes
    assert sum(causes.values()) == pytest.approx(analysis["attribution"]["measured_bubble_ns"])
    overlap = next((s for s in analysis["suggestions"] if s["kind"] == "overlap_dp_communication"), None)
    trade = next((s for s in analysis["suggestions"] if s["kind"] == "trade_dp_for_pp"), None)
    if dp >= 0.05 * analysis["step_ns"]:  # the rules' threshold: a twentieth of the step
        assert overlap is not None, analysis["suggestions"]
        assert f"{dp / 1e6:.1f} ms" in overlap["evidence"], overlap["evidence"]
        assert overlap["predicted_step_ns"] == pytest.approx(analysis["step_ns"] - dp, rel=1e-6)
        # the layout itself is priced too (tests/analysis/test_attribution.py checks the model): dp 2 -> 1
        # leaves no reduction, pp 2 -> 4 doubles the actions, each of which costs this CPU's runtime about
        # 2.5 ms beside 0.3-0.7 ms of work on these tiny stages, so here it is predicted slower and not offered
        if trade is not None:
            assert trade["apply"] == {"dp": 1, "pp": 4, "num_microbatches": 4} and trade["gain_fraction"] > 0, trade
    else:
        assert overlap is None and trade is None


def test_a_torch_compiled_region_runs_and_only_eager_calls_are_recorded(layouts: dict) -> None:
    """The collective traced into the compiled graph runs inside it (no Python call to wrap);
    the spans around it and the eager collective after it are recorded as usual."""
    _detail, steps = layouts["compiled"]
    for step in steps:
        for rank in range(2):
            kinds = Counter((s["kind"], s["bytes"]) for s in spans_of(step, rank))
            assert kinds[("forward", None)] == kinds[("backward", None)] == 1, kinds
            assert kinds[("all_reduce", 8 * FLOAT)] == 1, kinds
            assert sum(kinds.values()) == 3, kinds
