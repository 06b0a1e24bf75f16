"""The round trip: a real CPU pipeline job (gloo, 1F1B over 2 ranks, written from the README's snippet) is both
collected by bubblescope and profiled by torch.profiler (``record_shapes=True``, which names each send's peer);
importing its traces gives, per rank, the same compute, exposed communication and idle share of the step as the
collector measured (the median over the profiled steps: the first profiled step carries the profiler's own
start-up), and at least the waits for a peer (bubble) that the collector measured. On an otherwise idle machine the
shares agree within 2 points of the step (docs/traces.md, against the issue's 5); on a loaded 2-core CPU two
definitions part, one way each (the runtime's time between operators, a recv posted before its wait: docs/traces.md),
so the test holds compute and exposed communication one way within 8 points and compute the other way within 25."""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import LiveServer, run_rows, run_torchrun

pytestmark = [pytest.mark.slow, pytest.mark.timing]
STEPS = 8  # torch.profiler's schedule: 1 waiting, 1 warming up, 6 recorded (steps 2-7)
SHARES = ("compute", "exposed communication", "idle")
WAITS = ("dependency wait", "transfer", "bubble")


def shares_by_rank(db_url: str, run_key: str, steps: set[int]) -> dict[int, list[float]]:
    """Per rank, the median over ``steps`` of compute, exposed communication and idle over the step's window."""
    rows = run_rows(
        db_url,
        run_key,
        "SELECT rank, step, end_ns - start_ns, compute_ns, exposed_comm_ns, idle_ns FROM steps WHERE run_id = {run}",
    )
    per_rank: dict[int, list[tuple[float, float, float]]] = {}
    for rank, step, window, compute, exposed, idle in rows:
        if step in steps:
            per_rank.setdefault(rank, []).append((compute / window, exposed / window, idle / window))
    return {rank: [statistics.median(v[i] for v in values) for i in range(3)] for rank, values in per_rank.items()}


def waits_by_rank(server: LiveServer, run_key: str, steps: set[int]) -> dict[int, list[float]]:
    """Per rank, the analysis' dependency wait, transfer and bubble over ``steps``, each a share of the steps'
    windows (``GET /runs/{key}/steps/{step}``: a recv's time before its peer's send started is a wait)."""
    totals: dict[int, list[float]] = {}
    with server.client() as client:
        for step in sorted(steps):
            answer = client.get(f"/api/v1/runs/{run_key}/steps/{step}")
            assert answer.status_code == 200, answer.text
            for row in answer.json()["breakdown"]:
                figures = (row["window_ns"], row["dependency_wait_ns"], row["transfer_ns"], row["bubble_ns"])
                rank = totals.setdefault(row["rank"], [0.0] * 4)
                for index, value in enumerate(figures):
                    rank[index] += value
    return {rank: [value / sums[0] for value in sums[1:]] for rank, sums in totals.items()}


def collected_and_imported(
    server: LiveServer, folder: Path, key: str, *job_args: str, schedule: str | None = None, **env: str
) -> None:
    """The job run (collected as ``key``-collected, profiled into ``folder``), its traces imported (``key``-imported,
    with ``--schedule`` where given)."""
    job = run_torchrun(
        server.url,
        "tests/traces/profiled_pipeline_job.py",
        2,
        f"--trace-dir={folder}",
        f"--steps={STEPS}",
        *job_args,
        run_key=f"{key}-collected",
        extra_env=env,
    )
    assert job.returncode == 0, job.output[-3000:]
    traces = sorted(folder.glob("rank*.json"))
    assert [t.name for t in traces] == ["rank0.json", "rank1.json"]
    done = subprocess.run(
        [sys.executable, "-m", "bubblescope.cli", "import-trace", *map(str, traces), "--url", server.url]
        + ["--run", f"{key}-imported"]
        + (["--schedule", schedule] if schedule else []),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


PROFILED = set(range(2, STEPS))


def test_a_profiled_pipeline_job_imports_as_the_collector_measured_it(
    sqlite_server: LiveServer, tmp_path: Path
) -> None:
    collected_and_imported(sqlite_server, tmp_path, "round-trip")
    collected = shares_by_rank(sqlite_server.db_url, "round-trip-collected", PROFILED)
    imported = shares_by_rank(sqlite_server.db_url, "round-trip-imported", PROFILED)
    assert sorted(imported) == sorted(collected) == [0, 1], (collected, imported)
    print({"collected": collected, "imported": imported})
    for rank in (0, 1):
        (compute, exposed, idle), (their_compute, their_exposed, their_idle) = imported[rank], collected[rank]
        shown = {
            "imported": f"{compute:.1%}/{exposed:.1%}/{idle:.1%}",
            "collected": f"{their_compute:.1%}/{their_exposed:.1%}/{their_idle:.1%}",
        }
        # Two instruments on a shared 2-core CPU (docs/traces.md): within 2 points on an idle machine, but on a loaded
        # one two definitions part one way each. The runtime's own time between a stage's operators is compute to the
        # collector (its span covers the stage's forward or backward) and a gap in the trace: a loaded CI read rank
        # 0's compute 32.0% imported vs 48.4% collected (idle 18.3% vs 5.3%). And the time between posting a recv and
        # waiting on it is idle to the collector (its recv starts at the wait) and the recv's in the trace: another
        # read exposed communication 68.0% vs 53.8% (idle 6.5% vs 15.8%). So each is held one way, 8 points past
        # it, and compute within 25 points the other way.
        assert their_compute - 0.25 <= compute <= their_compute + 0.08, (rank, "compute", shown)
        assert exposed >= their_exposed - 0.08, (rank, "exposed communication", shown)
        assert compute + exposed >= 0.5, (rank, "the step read as idle", shown)


def test_an_imported_job_finds_every_wait_for_a_peer_the_collector_measured(
    sqlite_server: LiveServer, tmp_path: Path
) -> None:
    """The same job profiled with record_shapes (which names each gloo send's peer) and collected in full every
    step (the analysis pairs spans), without timing its stages' layers (their hooks run between operators)."""
    env = {"BUBBLESCOPE_FULL_SPANS_EVERY": "1", "BUBBLESCOPE_STAGE_LAYERS": "0"}
    collected_and_imported(sqlite_server, tmp_path, "round-trip-waits", "--record-shapes", **env)
    collected = waits_by_rank(sqlite_server, "round-trip-waits-collected", PROFILED)
    imported = waits_by_rank(sqlite_server, "round-trip-waits-imported", PROFILED)
    print({"collected": collected, "imported": imported})
    # Every recv found its send (by peer and order) and every wait the collector saw is found again. The import
    # may see more: the collector counts the time a rank is blocked on a posted send+recv pair as the send's
    # (transfer) and starts the recv at its own wait; the trace starts the recv where it was posted, so the time
    # before the peer's send began is a wait there (docs/traces.md, "Waits for a peer").
    # The bound is the shares' (8 points): on an idle machine the import's dependency wait is 1.5-2 points under the
    # collector's, and a loaded CI once put it 5.3 points under (28.5% against 33.8%).
    for rank in (0, 1):
        for what, ours, theirs in zip(WAITS, imported[rank], collected[rank]):
            if what != "transfer":
                assert ours >= theirs - 0.08, (rank, what, f"imported {ours:.1%}, collected {theirs:.1%}")


@pytest.mark.parametrize(
    ("schedule", "named", "stages"), [("1f1b", "1f1b", 2), ("gpipe", "gpipe", 2), ("interleaved", "interleaved1f1b", 4)]
)
def test_an_imported_pipeline_gets_its_stages_micro_batches_and_bubble(
    sqlite_server: LiveServer, tmp_path: Path, schedule: str, named: str, stages: int
) -> None:
    """1F1B (nothing annotated: cut at its P2P calls), GPipe (``Forward i``/``Backward i``) and interleaved 1F1B
    (``PP:{stage}{F|B}{mb}``, two stages a rank), profiled with record_shapes (the recvs' peers: their waits are bubble): the imported run has the collected run's stages
    and micro-batches, a replay of its pipeline, and a measured bubble near the collected one."""
    key = f"round-trip-{schedule}"
    job = (f"--schedule={schedule}", "--record-shapes")
    collected_and_imported(  # every step in full: by default only every 10th (step 0, warm-up) has spans
        sqlite_server,
        tmp_path,
        key,
        *job,
        schedule=named,
        BUBBLESCOPE_STAGE_LAYERS="0",
        BUBBLESCOPE_FULL_SPANS_EVERY="1",
    )
    with sqlite_server.client() as client:
        runs = {kind: client.get(f"/api/v1/runs/{key}-{kind}").json() for kind in ("collected", "imported")}
        steps = f"from_step={min(PROFILED)}&to_step={max(PROFILED)}"  # the same steps in both (the collected run's
        # first 5 are warm-up by default, the imported run's are not: the profiler left its own out)
        analyses = {kind: client.get(f"/api/v1/runs/{key}-{kind}/analysis?{steps}").json() for kind in runs}
    config = runs["imported"]["config"]
    assert (config["num_stages"], config["num_microbatches"]) == (stages, 4), config
    assert config.get("virtual_stages", 1) == stages // 2 and config["schedule"], config
    spans = run_rows(
        sqlite_server.db_url,
        f"{key}-imported",
        "SELECT DISTINCT rank, stage, microbatch FROM spans WHERE run_id = {run} AND stage IS NOT NULL",
    )
    assert {(stage % 2, stage, mb) for stage in range(stages) for mb in range(4)} == set(spans), spans
    registered = {r["rank"]: r["stages"] for r in runs["imported"]["ranks"]}
    assert registered == {rank: list(range(rank, stages, 2)) for rank in (0, 1)}, registered
    bubbles = {kind: analyses[kind]["attribution"] for kind in analyses}
    assert all(b is not None for b in bubbles.values()), {k: a["pipeline_unavailable"] for k, a in analyses.items()}
    measured = {kind: b["measured_bubble_fraction"] for kind, b in bubbles.items()}
    print(schedule, measured)
    # Not closer: on this CPU the runtime's own time between actions lands in the trace's operators, which the
    # collector counts as idle (over 5 runs each, up to 10 points apart for interleaved, the import lower).
    assert abs(measured["imported"] - measured["collected"]) <= 0.15, measured
