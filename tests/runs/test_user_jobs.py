"""Jobs without a pipeline, written as users write them from docs/collector.md (``tests/runs/user_jobs.py``):
a plain DDP loop, FSDP2 per block, tensor parallelism with DTensor, a hand loop. Each run under torchrun
(gloo, 2 ranks) into a real service; its compute is recorded without a span written by hand, its page
speaks of its step (no bubble, no pipeline replay), and its figures agree with the job's own clock.

The job's own forward + backward (``time.perf_counter``) holds its compute and whatever it blocked on
inside ``backward()``: DDP waits there for its last gradient buckets, FSDP2 for its last reduce-scatter and
its all-gathers. So the service's compute is at most the job's figure (10% margin), and compute plus
exposed communication at least that figure less 15%; in the hand loop, whose reduction runs after
``backward()``, the compute alone is within 10% of it.
"""

from __future__ import annotations

import json
import statistics
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import LiveServer, migrated_database, run_torchrun, start_server, wait_for_steps

pytestmark = [pytest.mark.slow, pytest.mark.timing]
MARGIN = 0.15  # compute against the job's own forward + backward: a loaded CI machine read 25.4% of its 28.9%
COVERED_MARGIN = 0.15  # compute + exposed communication against the job's own forward + backward: a loaded CI
# machine read 85.2% of the job's 97.0% for the DDP loop (the rest: host gaps between the hooks and its own clock)
STEPS = 16
INJECTED_MS = 40  # the fault the fix tests inject: 40 ms of loading, or of host work on the late rank


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with migrated_database("sqlite", tmp_path_factory.mktemp("db")) as url:
        live = start_server(url, tmp_path_factory.mktemp("server"))
        yield live
        live.stop()


def run_job(
    service: LiveServer, tmp: Path, mode: str, every: int = 1, *extra: str, ranks: int = 2
) -> tuple[str, list[list[dict[str, float]]]]:
    run_key = f"user-{mode}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True, exist_ok=True)
    report = tmp / f"{mode}-own"
    job = run_torchrun(
        service.url,
        "tests/runs/user_jobs.py",
        ranks,
        mode,
        f"--run-name={mode}",
        f"--report={report}",
        f"--steps={STEPS}",
        *extra,
        run_key=run_key,
        extra_env={"BUBBLESCOPE_FULL_SPANS_EVERY": str(every)},
    )
    assert job.returncode == 0, job.output[-3000:]
    own = [json.loads(Path(f"{report}.{rank}.json").read_text()) for rank in range(ranks)]
    return run_key, own


def analysis_of(service: LiveServer, run_key: str, spanned_steps: int, ranks: int = 2) -> dict[str, Any]:
    with httpx.Client(base_url=service.url, timeout=30) as client:
        wait_for_steps(client, run_key, ranks, spanned_steps)
        response = client.get(f"/api/v1/runs/{run_key}/analysis")
        assert response.status_code == 200, response.text
        return response.json()


def own_share(own: list[list[dict[str, float]]], steps: list[int]) -> float:
    """The job's own forward + backward over its steps, summed over the ranks and the analysed steps (as the
    service's split is a mean over them)."""
    rows = [row for rank in own for step, row in enumerate(rank) if step in steps]
    return sum(row["forward_s"] + row["backward_s"] for row in rows) / sum(row["step_s"] for row in rows)


def part(analysis: dict[str, Any], name: str) -> float:
    return next(p["fraction_of_step"] for p in analysis["step_split"]["parts"] if p["name"] == name)


@pytest.mark.parametrize(("mode", "ranks"), [("ddp", 2), ("fsdp2", 2), ("tp", 2), ("hand", 2), ("tp", 4)])
def test_a_job_without_a_pipeline_shows_its_compute_and_its_step_not_a_bubble(
    service: LiveServer, tmp_path: Path, mode: str, ranks: int
) -> None:
    """``tp`` on 4 ranks: 2 × 2 dp × tp, DDP over dp on the tensor-parallel model."""
    run_key, own = run_job(service, tmp_path, mode, ranks=ranks)
    analysis = analysis_of(service, run_key, STEPS, ranks)
    split = analysis["step_split"]
    assert split is not None and split["compute_instrumented"], analysis
    assert analysis["pipeline_unavailable"] is None and analysis["attribution"] is None
    parts = {p["name"]: p["ns"] for p in split["parts"]}
    assert sum(parts.values()) == pytest.approx(split["window_ns"], rel=0.02)
    compute = part(analysis, "model_compute")
    exposed = part(analysis, "collective_wait") + part(analysis, "collective_transfer")
    theirs = own_share(own, analysis["steps"])
    detail = (
        f"ours: compute {compute:.1%}, exposed communication {exposed:.1%}; the job's forward+backward {theirs:.1%}"
    )
    if mode == "hand":
        assert abs(compute - theirs) <= MARGIN * theirs, detail
    else:
        assert compute <= theirs * (1 + MARGIN), detail
        assert compute + exposed >= theirs * (1 - COVERED_MARGIN), detail
    assert compute > 0.2, detail  # the training is not read as idle
    for group in split["groups"]:  # exposed communication split into waiting for peers and transfer
        assert group["wait_ns"] + group["transfer_ns"] == pytest.approx(group["exposed_ns"], rel=1e-6)
    assert split["groups"], analysis
    if mode == "tp":  # registered as two meshes, dp and tp: each rank's coordinates in both, tp's waits split
        with httpx.Client(base_url=service.url, timeout=30) as client:
            coords = {r["rank"]: r["coords"] for r in client.get(f"/api/v1/runs/{run_key}").json()["ranks"]}
        replicas = ranks // 2 if ranks >= 4 else 1
        tp = ranks // replicas
        assert coords == {rank: {"dp": rank // tp, "tp": rank % tp} for rank in range(ranks)}
        groups = [g["group"] for g in split["groups"]]  # the most exposed first
        assert "tp" in groups, split["groups"]
        if replicas > 1:  # DDP's gradient buckets over dp: 4 ranks on 2 cores, either may wait the most
            assert "dp" in groups, split["groups"]
        else:
            assert groups[:1] == ["tp"], split["groups"]
    for suggestion in analysis["suggestions"]:
        assert "bubble" not in suggestion["title"].lower() and suggestion["kind"] not in ("pipeline_it", "rebalance")


@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_each_block_is_priced_and_the_heavy_one_named(service: LiveServer, tmp_path: Path, mode: str) -> None:
    """Block 2 of 4 runs four linear layers where the others run one: the page's per-block costs list the
    blocks in model order and name block 2 the heaviest, about four times another's (3-4.2× seen here); the
    blocks' shares of the model's compute add up to about 1 (0.84-1.07 seen: medians over steps and ranks do
    not add exactly, and FSDP2's hooks inside a block count to it); the model's compute stays what it was."""
    run_key, own = run_job(service, tmp_path, mode, 1, "--blocks", "--heavy-block=2")
    analysis = analysis_of(service, run_key, STEPS)
    costs = analysis["block_costs"]
    assert [c["block"] for c in costs] == ["0", "1", "2", "3"], costs
    totals = {c["block"]: c["forward_ns"] + c["backward_ns"] for c in costs}
    light = sorted(v for k, v in totals.items() if k != "2")
    assert max(totals, key=totals.__getitem__) == "2", totals
    assert totals["2"] >= 2.0 * light[1], totals
    shares = sum(c["share_of_model"] for c in costs)
    assert 0.5 <= shares <= 1.2, costs
    compute = part(analysis, "model_compute")
    theirs = own_share(own, analysis["steps"])
    assert compute <= theirs * (1 + MARGIN) and compute > 0.2, (compute, theirs)


def test_a_short_run_with_sparse_spans_is_analysed_on_every_step_past_the_warm_up(
    service: LiveServer, tmp_path: Path
) -> None:
    """Full spans every 10th step: steps 0 and 10 have spans, the others only their aggregates."""
    run_key, _own = run_job(service, tmp_path, "ddp", every=10)
    analysis = analysis_of(service, run_key, 2)
    assert analysis["steps"] == list(range(5, STEPS)), analysis["steps"]
    assert analysis["steps_from_aggregates"] == [s for s in range(5, STEPS) if s != 10]
    assert part(analysis, "model_compute") > 0.2, analysis["step_split"]
    with httpx.Client(base_url=service.url, timeout=30) as client:
        step = client.get(f"/api/v1/runs/{run_key}/steps/7").json()
    rows = step["breakdown"]
    assert rows and all(not r["from_spans"] and r["compute_ns"] > 0 for r in rows), rows
    assert all(r["bubble_fraction"] < 0.8 for r in rows), rows


def analysis_over(service: LiveServer, run_key: str, first: int, last: int) -> dict[str, Any]:
    with httpx.Client(base_url=service.url, timeout=30) as client:
        response = client.get(f"/api/v1/runs/{run_key}/analysis", params={"from_step": first, "to_step": last})
        assert response.status_code == 200, response.text
        return response.json()


@pytest.mark.parametrize(
    ("kind", "fault"), [("background_data_loading", f"--loader-ms={INJECTED_MS}"), ("late_rank", "--slow-rank=1")]
)
def test_a_fix_applied_as_suggested_gives_about_the_predicted_step(
    service: LiveServer, tmp_path: Path, kind: str, fault: str
) -> None:
    """The DDP job with a slow data loader (40 ms a batch on the training thread), or with rank 1 late by 40 ms
    of host work a step, for 12 steps; then, in the same job, 24 steps with the fault on every other one (the loading
    hidden entirely, as background workers would; the late rank on time). The fix suggested on steps 5-11 is checked
    on the job's own clock, each step's cycle (its loading included) from step 14 on, the steps without the fault
    against those with it: interleaved, so a load that changes during the run on this shared machine weighs on both
    (a CI run that compared steps 17-23, all fixed, with steps 5-11 read the fixed steps 14 ms slower: 82.5 ms a step,
    predicted 44.6, fixed 96.9). The predicted gain is the 40 ms injected, within −25% and +35%: what the service
    measured of the fault, which holds the late rank's slower compute after its sleep (a CI run measured rank 1 51.1 ms
    late: 88.7 ms a step, predicted 37.6). The realised gain is 0.2-2.5 times the predicted one: two ranks share two cores here, which no replay
    of the measured step knows. While rank 1 sleeps, rank 0 computes alone and faster; after a 40-ms sleep the same
    forward and backward run slower; and on a loaded machine other processes take the core a sleeper leaves."""
    run_key, own = run_job(
        service, tmp_path, "ddp", 1, fault, f"--slow-ms={INJECTED_MS}", "--alternate-from=12", "--steps=36"
    )
    with httpx.Client(base_url=service.url, timeout=30) as client:
        wait_for_steps(client, run_key, 2, 36)
    before = analysis_over(service, run_key, 5, 11)
    fix = next((s for s in before["suggestions"] if s["kind"] == kind), None)
    assert fix is not None, [s["kind"] for s in before["suggestions"]]
    assert fix["gain_fraction"] > 0.15, fix
    cycles = {
        faulty: [rank[step]["cycle_s"] * 1e9 for rank in own for step in range(14 + faulty, 36, 2)] for faulty in (0, 1)
    }
    realised = statistics.mean(cycles[1]) - statistics.mean(cycles[0])
    predicted_gain = fix["current_step_ns"] - fix["predicted_step_ns"]
    detail = f"{kind}: {fix['current_step_ns'] / 1e6:.1f} ms, predicted {fix['predicted_step_ns'] / 1e6:.1f}; own cycles {statistics.mean(cycles[1]) / 1e6:.1f} with the fault, {statistics.mean(cycles[0]) / 1e6:.1f} without"
    assert 0.75 * INJECTED_MS * 1e6 <= predicted_gain <= 1.35 * INJECTED_MS * 1e6, detail
    assert 0.2 * predicted_gain <= realised <= 2.5 * predicted_gain, detail


def test_a_job_declaring_its_model_gets_the_planners_memory_fix_priced_as_plan_prices_it(
    service: LiveServer, tmp_path: Path
) -> None:
    """An FSDP2 job that declares what it stands for in ``collector.init(config=...)`` (docs/collector.md): Llama 3 8B
    at 32k tokens on 8 H100s, FSDP and full recompute. The planner puts that over its GPUs' memory, so the run's
    analysis offers splitting each sequence over two context-parallel ranks (data parallel 4), its predicted step the
    measured one times the ratio ``POST /plan`` gives for the two layouts."""
    model = {"preset": "llama-3-8b", "seq": 32768}
    layout = {"zero": 3, "recompute": "full"}
    declared = {"model": model, "cluster": "h100-sxm-x8", "global_batch": 8, "microbatch_size": 1, **layout}
    run_key, _ = run_job(service, tmp_path, "fsdp2", 1, f"--declare={json.dumps(declared)}")
    analysis = analysis_of(service, run_key, STEPS)
    fixes = [s for s in analysis["suggestions"] if s["kind"] == "memory_pressure"]
    assert [s["apply"] for s in fixes] == [{"cp": 2, "dp": 4}], fixes
    (split,) = fixes
    assert split["torchtitan"] == {"parallelism.context_parallel_degree": 2}, split
    with httpx.Client(base_url=service.url, timeout=30) as client:

        def planned(config: dict[str, Any]) -> float:
            body = {"model": model, "cluster": "h100-sxm-x8", "global_batch": 8, "config": {"mbs": 1, **config}}
            answer = client.post("/api/v1/plan", json=body)
            assert answer.status_code == 200, answer.text
            return answer.json()["plans"][0]["step_time_s"]

        ratio = planned({**layout, "cp": 2, "dp": 4}) / planned(layout)
    assert split["predicted_step_ns"] == pytest.approx(split["current_step_ns"] * ratio, rel=1e-6), split
