"""``bubblescope import-trace``: the reference traces (real A100 jobs with NCCL kernels) and traces written here,
imported into a real SQLite database through the service's own routes (``--db``) and, once, over HTTP to a real
uvicorn server (``--url``); bad files refused with one line and nothing stored."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bubblescope.analysis.trace_figures import own_split
from bubblescope.intervals import union_length
from bubblescope.kineto import TraceError, read_rank_trace
from tests.support import migrated_database, run_rows, start_server
from tests.traces.support import JOBS, job_files
from tests.traces.written import kernel, trace, two_stage_p2p_traces, write


@pytest.fixture
def db_url(tmp_path: Path) -> Iterator[str]:
    with migrated_database("sqlite", tmp_path) as url:
        yield url


def import_trace(*args: str | Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "bubblescope.cli", "import-trace", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def profiler_steps(path: Path) -> list[int]:
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return sorted({int(m.group(1)) for e in events if (m := re.match(r"ProfilerStep#(\d+)$", str(e.get("name"))))})


def api(db_url: str, path: str) -> Any:
    from fastapi.testclient import TestClient

    from bubblescope.backend.app import create_app

    with TestClient(create_app(db_url)) as client:
        response = client.get(path)
        assert response.status_code == 200, response.text
        return response.json()


@pytest.mark.parametrize("job", sorted(JOBS))
def test_a_reference_trace_becomes_a_finished_run_of_its_profiler_steps(db_url: str, job: str) -> None:
    files = job_files(job)
    done = import_trace(*files, "--db", db_url, "--run", job)
    assert done.returncode == 0, done.stderr
    run = api(db_url, f"/api/v1/runs/{job}")
    source = run["config"]["imported_from"]
    assert run["state"] == "finished" and "imported from profiler traces" in run["state_detail"], run
    assert sorted(source["files"].values()) == sorted(path.name for path in files)
    assert [s["step"] for s in run["steps"]] == profiler_steps(files[0])
    assert all(s["complete"] and not s["warmup"] for s in run["steps"]), run["steps"]  # sampled ranks, active steps
    for path in files:
        read = read_rank_trace(path)
        rank = source["ranks"][sorted(source["files"].values()).index(path.name)]
        last = max(profiler_steps(path))
        spans = run_rows(  # the GPU's: a step's compute_ns also counts its data loading (a host span), as collected
            db_url,
            job,
            "SELECT start_ns, end_ns FROM spans WHERE run_id = {run} "
            f"AND rank = {rank} AND step < {last} AND kind IN ('forward', 'backward', 'optimizer')",
        )
        compute = union_length(spans)
        ours = own_split(read.activities)  # HTA's selection: the steps before the last, compute and copies apart
        span_ns = 1000 * (max(a.end for a in read.activities) - min(a.start for a in read.activities))
        expected = 1000 * (ours.compute_us + ours.memory_us)
        assert abs(compute - expected) <= 0.01 * span_ns, (rank, compute, expected, span_ns)
    analysis = api(db_url, f"/api/v1/runs/{job}/analysis")
    assert analysis["step_split"] is not None and analysis["pipeline"] is None


def test_nccl_kernels_are_communication_of_their_collective_and_group(db_url: str) -> None:
    """The A100 DDP trace names its collectives and process group on each kernel (``Collective name``,
    ``Process Group Ranks``); the 8-rank trace's ``ncclKernel_SendRecv`` kernels run the all-to-all that the
    ``nccl:all_to_all`` annotation around their launch names."""
    (ddp,) = job_files("nccl_data_rank0_of2_a100")
    (eight,) = job_files("trace_diff_control_rank3_of8_a100")
    for path, run in ((ddp, "ddp"), (eight, "eight")):
        assert import_trace(path, "--db", db_url, "--run", run).returncode == 0
    kinds = dict(
        run_rows(db_url, "ddp", "SELECT kind, count(*) FROM spans WHERE run_id = {run} GROUP BY kind").__iter__()
    )
    groups = {
        g
        for (g,) in run_rows(
            db_url, "ddp", "SELECT DISTINCT \"group\" FROM spans WHERE run_id = {run} AND kind = 'all_reduce'"
        )
    }
    assert kinds.get("all_reduce", 0) > 0 and kinds.get("broadcast", 0) > 0 and groups == {"world"}, (kinds, groups)
    eight_kinds = dict(run_rows(db_url, "eight", "SELECT kind, count(*) FROM spans WHERE run_id = {run} GROUP BY kind"))
    assert eight_kinds.get("all_to_all", 0) > 0 and "send" not in eight_kinds and "recv" not in eight_kinds, eight_kinds
    assert (
        eight_kinds.get("backward", 0) > 0 and eight_kinds.get("forward", 0) > 0 and eight_kinds.get("optimizer", 0) > 0
    )


def test_each_generation_of_nccl_kernel_is_read_as_communication(db_url: str, tmp_path: Path) -> None:
    names = {
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)": "all_reduce",
        "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "reduce_scatter",
        "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "all_gather",
        "void rcclKernel_Broadcast_RING_LL(ncclWorkElem)": "broadcast",
    }
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "ts": 0, "dur": 1000}]
    for index, name in enumerate(names):
        events += kernel(10 + 100 * index, 50, name, correlation=index + 1, stream=9)
    events += kernel(500, 50, "ncclDevKernel_Generic", correlation=10, stream=9)
    events[-1]["args"]["Collective name"] = "_reduce_scatter_base"  # a generic kernel: its collective says it
    done = import_trace(write(tmp_path / "rank0.json", trace(events=events)), "--db", db_url, "--run", "gen")
    assert done.returncode == 0, done.stderr
    stored = run_rows(db_url, "gen", "SELECT kind FROM spans WHERE run_id = {run} ORDER BY start_ns")
    assert [kind for (kind,) in stored] == [*names.values(), "reduce_scatter"]


def test_importing_again_stores_nothing_twice(db_url: str) -> None:
    (path,) = job_files("nccl_data_rank0_of2_a100")
    counts = []
    for _ in range(2):
        assert import_trace(path, "--db", db_url, "--run", "again").returncode == 0
        counts.append(run_rows(db_url, "again", "SELECT count(*) FROM spans WHERE run_id = {run}")[0][0])
    assert counts[0] == counts[1] > 1000, counts


def test_bad_files_are_refused_with_one_line_and_nothing_stored(db_url: str, tmp_path: Path) -> None:
    whole = gzip.compress(json.dumps(trace()).encode())
    truncated = tmp_path / "cut_rank1.json.gz"
    truncated.write_bytes(whole[: len(whole) // 2])
    good = write(tmp_path / "rank0.json", trace(rank=0))
    no_steps = [e for e in trace()["traceEvents"] if "ProfilerStep" not in e["name"]]
    cases = {
        "truncated gzip": ([good, truncated], "cannot be read to its end"),
        "nothing run": (
            [good, write(tmp_path / "cpu_rank1.json", trace(1, trace()["traceEvents"][:2]))],
            "no CPU operators",
        ),
        "no rank": ([good, write(tmp_path / "trace.json", trace(rank=None))], "no rank"),
        "same rank": ([good, write(tmp_path / "again.json", trace(rank=0))], "both hold rank 0"),
        "no steps": ([good, write(tmp_path / "rank1.json", trace(1, no_steps))], "no ProfilerStep#N"),
    }
    for what, (files, said) in cases.items():
        done = import_trace(*files, "--db", db_url, "--run", "bad")
        assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr, (what, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, (what, done.stderr)
        assert run_rows(db_url, "bad", "SELECT count(*) FROM runs WHERE key = :key")[0][0] == 0, what


def test_fractional_nanosecond_times_keep_their_nanoseconds(db_url: str, tmp_path: Path) -> None:
    events = trace()["traceEvents"]
    events[3]["ts"], events[3]["dur"] = 110.123, 30.456  # the GEMM: 110.123 us for 30.456 us
    done = import_trace(write(tmp_path / "rank0.json", trace(events=events)), "--db", db_url, "--run", "ns")
    assert done.returncode == 0, done.stderr
    rows = run_rows(
        db_url, "ns", "SELECT start_ns, end_ns FROM spans WHERE run_id = {run} AND kind = 'forward' AND step = 1"
    )
    assert rows == [(110_123, 140_579)], rows


def test_an_import_over_http_prints_the_runs_address(tmp_path: Path) -> None:
    with migrated_database("sqlite", tmp_path) as url:
        live = start_server(url, tmp_path)
        try:
            (path,) = job_files("nccl_data_rank0_of2_a100")
            done = import_trace(path, "--url", live.url, "--run", "over http")
            assert done.returncode == 0, done.stderr
            assert f"{live.url}/runs/over-http" in done.stdout, done.stdout
            with live.client() as client:
                assert client.get("/api/v1/runs/over-http").json()["state"] == "finished"
        finally:
            live.stop()


def test_a_step_of_more_kernels_than_one_batch_holds_is_stored_whole(db_url: str, tmp_path: Path) -> None:
    """A large model's step launches tens of thousands of kernels; the service takes 100,000 spans a batch (and the
    collector sends 20,000): the import sends such a step in several batches, its aggregate once."""
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "ts": 0, "dur": 200_000}]
    for index in range(45_000):
        events += kernel(10 + 4 * index, 2, "sm90_gemm", correlation=index + 1)
    done = import_trace(write(tmp_path / "rank0.json", trace(events=events)), "--db", db_url, "--run", "many")
    assert done.returncode == 0, done.stderr
    (spans,) = run_rows(db_url, "many", "SELECT count(*) FROM spans WHERE run_id = {run}")[0]
    steps = run_rows(db_url, "many", "SELECT step, compute_ns FROM steps WHERE run_id = {run}")
    assert spans == 45_000 and steps == [(3, 45_000 * 2_000)], (spans, steps)


def test_a_collective_running_past_the_next_steps_first_kernel_counts_whole(db_url: str, tmp_path: Path) -> None:
    """Step 1's all-reduce runs 130-250 us; step 2's first kernel starts at 210 us on another stream."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": 100 * n, "dur": 100} for n in (1, 2)
    ]
    events += kernel(110, 20, "sm80_gemm", 1) + kernel(130, 120, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 2, stream=9)
    events += kernel(210, 10, "elementwise_kernel", 3)
    done = import_trace(write(tmp_path / "rank0.json", trace(events=events)), "--db", db_url, "--run", "spill")
    assert done.returncode == 0, done.stderr
    rows = run_rows(
        db_url, "spill", "SELECT step, start_ns, end_ns, comm_ns FROM steps WHERE run_id = {run} ORDER BY step"
    )
    assert rows[0] == (1, 110_000, 250_000, 120_000), rows


def test_a_cpu_profile_counts_an_operator_that_starts_with_its_child_whole(db_url: str, tmp_path: Path) -> None:
    step = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 10_000, "tid": 1}
    parent = {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "ts": 1_000, "dur": 5_000, "tid": 1, "pid": 7}
    child = {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "ts": 1_000, "dur": 1_000, "tid": 1, "pid": 7}
    done = import_trace(
        write(tmp_path / "rank0.json", trace(events=[step, child, parent])), "--db", db_url, "--run", "cpu"
    )
    assert done.returncode == 0, done.stderr
    assert run_rows(db_url, "cpu", "SELECT compute_ns FROM steps WHERE run_id = {run}") == [(5_000_000,)]


def test_a_recv_kernels_time_before_its_peers_send_started_is_a_wait(db_url: str, tmp_path: Path) -> None:
    """``written.two_stage_p2p_traces``: rank 1's recvs wait 30 and 13 us for rank 0's sends to start, then
    transfer 20 and 10 us. The nth send from 0 to 1 is the nth recv on 1 (NCCL's order between a pair)."""
    files = [write(tmp_path / f"rank{r}.json", trace(r, events)) for r, events in two_stage_p2p_traces().items()]
    done = import_trace(*files, "--db", db_url, "--run", "p2p")
    assert done.returncode == 0, done.stderr
    names = run_rows(
        db_url, "p2p", "SELECT rank, kind, name, peer FROM spans WHERE run_id = {run} AND peer IS NOT NULL"
    )
    assert sorted(names) == [
        (0, "send", "p2p #1", 1),
        (0, "send", "p2p #2", 1),
        (1, "recv", "p2p #1", 0),
        (1, "recv", "p2p #2", 0),
    ]
    breakdown = {row["rank"]: row for row in api(db_url, "/api/v1/runs/p2p/steps/1")["breakdown"]}
    assert breakdown[1]["dependency_wait_ns"] == 30_000 + 13_000, breakdown[1]
    assert breakdown[1]["transfer_ns"] == 20_000 + 10_000, breakdown[1]
    assert breakdown[0]["dependency_wait_ns"] == 0, breakdown[0]  # each send found its recv posted


def test_a_files_events_wait_on_disk_and_are_removed_with_its_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The import holds a step at a time: the file's events and its converted batches wait in a temporary folder
    (``trace_spill``), read back as they are sent, removed once nothing reads them, and after a refused file."""
    import gc
    import tempfile

    from bubblescope.trace_import import convert, requests_for

    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spill))
    path = job_files("nccl_data_rank0_of2_a100")[0]
    imported = convert(path, "disk")
    assert [p.name[:18] for p in spill.iterdir()] == ["bubblescope-trace-"]
    assert not isinstance(imported.batches, list)
    sent = [d for method, _, d in requests_for([imported], "disk", "disk") if method == "POST"]
    assert len(sent) == len(imported.batches) == len(imported.steps) > 0
    assert [d["steps"][0]["step"] for d in sent] == imported.steps
    assert sent == list(imported.batches)  # read again, the same
    del imported, sent
    gc.collect()
    assert list(spill.iterdir()) == []
    with pytest.raises(TraceError):
        convert(write(tmp_path / "rank0.json", trace(events=kernel(10, 5, "sm80_gemm", 1))), "disk")
    gc.collect()
    assert list(spill.iterdir()) == []


def test_an_import_into_a_new_database_file_migrates_it_first(tmp_path: Path) -> None:
    fresh = f"sqlite:///{tmp_path / 'new.db'}"
    done = import_trace(write(tmp_path / "rank0.json", trace()), "--db", fresh, "--run", "fresh")
    assert done.returncode == 0, done.stderr
    assert run_rows(fresh, "fresh", "SELECT step FROM steps WHERE run_id = {run}") == [(1,), (2,)]
    unreachable = "postgresql+psycopg://nobody@127.0.0.1:1/none"
    refused = import_trace(write(tmp_path / "rank0.json", trace()), "--db", unreachable)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert refused.stderr.startswith("bubblescope import-trace: ") and len(refused.stderr.splitlines()) == 1


def annotation(name: str, ts: float, dur: float, tid: int = 1, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur, "tid": tid, "args": args}


def test_a_collective_op_that_began_before_the_step_still_names_its_kernel(db_url: str, tmp_path: Path) -> None:
    """The all-gather's record_param_comms starts 5 us before ProfilerStep#1 and launches a generic NCCL kernel
    inside it: the kernel is the all-gather the op names, read from an interval that starts before the step."""
    events = [annotation("ProfilerStep#1", 100, 100)]
    op = {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": 95, "dur": 40, "tid": 0}  # as the launch
    op["args"] = {"Collective name": "all_gather", "Process Group Name": "0"}
    events += [op, *kernel(120, 30, "ncclDevKernel_Generic", 1, stream=9)]
    done = import_trace(write(tmp_path / "rank0.json", trace(events=events)), "--db", db_url, "--run", "before")
    assert done.returncode == 0, done.stderr
    assert run_rows(db_url, "before", "SELECT kind FROM spans WHERE run_id = {run}") == [("all_gather",)]


def test_steps_annotated_twice_or_inside_another_keep_what_is_theirs(db_url: str, tmp_path: Path) -> None:
    """ProfilerStep#1 and #2 annotated on two threads, interleaved; #3 nested inside #4; #5 annotated again later:
    a kernel belongs to the latest-starting annotation holding its launch, and one number is one step."""
    events = [
        annotation("ProfilerStep#1", 0, 100, tid=1),
        annotation("ProfilerStep#1", 5, 90, tid=2),
        annotation("ProfilerStep#2", 100, 100, tid=1),
        annotation("ProfilerStep#2", 105, 90, tid=2),
        annotation("ProfilerStep#4", 300, 100, tid=1),
        annotation("ProfilerStep#3", 310, 20, tid=2),
        annotation("ProfilerStep#5", 500, 50, tid=1),
        annotation("ProfilerStep#5", 700, 50, tid=1),
    ]
    launches = {1: 50, 2: 97, 3: 150, 4: 315, 5: 350, 6: 510, 7: 710}  # correlation -> launch (us)
    for correlation, at in launches.items():
        events += kernel(at + 5, 1, "sm80_gemm", correlation)
    done = import_trace(write(tmp_path / "rank0.json", trace(events=events)), "--db", db_url, "--run", "twice")
    assert done.returncode == 0, done.stderr
    rows = run_rows(db_url, "twice", "SELECT step, start_ns FROM spans WHERE run_id = {run} ORDER BY start_ns")
    assert [(step, start // 1000) for step, start in rows] == [
        (1, 55),
        (1, 102),
        (2, 155),
        (3, 320),
        (4, 355),
        (5, 515),
        (5, 715),
    ]


def test_ids_past_what_can_be_stored_pair_nothing_and_times_past_it_are_refused(db_url: str, tmp_path: Path) -> None:
    big = 10**20
    events = [annotation("ProfilerStep#1", 0, 100), *kernel(10, 1, "sm80_gemm", big), *kernel(20, 1, "sm80_gemm", 1)]
    events[1]["tid"] = 2**70
    done = import_trace(write(tmp_path / "rank0.json", trace(events=events)), "--db", db_url, "--run", "big")
    assert done.returncode == 0, done.stderr
    assert run_rows(db_url, "big", "SELECT start_ns FROM spans WHERE run_id = {run}") == [(20_000,)]
    far = [annotation("ProfilerStep#1", 0, 100), *kernel(10, 1, "sm80_gemm", 1), annotation("x", 1e300, 1)]
    refused = import_trace(write(tmp_path / "rank1.json", trace(rank=1, events=far)), "--db", db_url)
    assert refused.returncode == 2 and "times past what a run can store" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr


def test_the_wait_for_the_next_batch_is_data_loading_not_the_models_compute(db_url: str, tmp_path: Path) -> None:
    """torch records a DataLoader's ``next()`` as ``enumerate(DataLoader)#...__next__`` (its collation, aten::stack,
    inside it): on a GPU trace it is a data_loading span at the step's start; on a CPU trace too, and the operators
    inside it are not the forward pass."""
    loader = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    steps = [
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": 100 * n, "dur": 100} for n in (1, 2)
    ]
    loading = [{"ph": "X", "cat": "cpu_op", "name": loader, "ts": 100 * n + 1, "dur": 20} for n in (1, 2)]
    gpu = steps + loading + kernel(130, 30, "sm80_gemm", 1) + kernel(230, 10, "elementwise_kernel", 2)
    done = import_trace(write(tmp_path / "rank0.json", trace(events=gpu)), "--db", db_url, "--run", "gpu-loader")
    assert done.returncode == 0, done.stderr
    query = (
        "SELECT step, kind, start_ns, end_ns FROM spans WHERE run_id = {run} AND kind = 'data_loading' ORDER BY step"
    )
    assert run_rows(db_url, "gpu-loader", query) == [
        (1, "data_loading", 101_000, 121_000),
        (2, "data_loading", 201_000, 221_000),
    ]
    window = "SELECT start_ns, end_ns FROM steps WHERE run_id = {run} ORDER BY step"
    assert run_rows(db_url, "gpu-loader", window)[0] == (101_000, 201_000)  # the step begins with its wait for data

    # A host ahead of its GPU loads step 2's batch (at 150 us) while step 1's kernel still runs (to 190): the
    # windows meet at step 1's end, they do not overlap.
    ahead = [
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": ts, "dur": dur}
        for n, ts, dur in ((1, 100, 45), (2, 145, 100))  # the host's steps: step 2 begins at 145 us
    ]
    ahead += [{"ph": "X", "cat": "cpu_op", "name": loader, "ts": t, "dur": 20} for t in (101, 150)]
    ahead += kernel(130, 60, "sm80_gemm", 1) + kernel(230, 10, "elementwise_kernel", 2)
    done = import_trace(write(tmp_path / "ahead-rank0.json", trace(events=ahead)), "--db", db_url, "--run", "ahead")
    assert done.returncode == 0, done.stderr
    assert run_rows(db_url, "ahead", window) == [(101_000, 190_000), (190_000, 240_000)]

    cpu_step = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 10_000, "tid": 1}
    cpu_loader = {"ph": "X", "cat": "cpu_op", "name": loader, "ts": 100, "dur": 2_000, "tid": 1, "pid": 7}
    collation = {"ph": "X", "cat": "cpu_op", "name": "aten::stack", "ts": 200, "dur": 1_500, "tid": 1, "pid": 7}
    # the model's first operator starts the microsecond the loading ends: it is the forward's, not the loading's
    linear = {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "ts": 2_100, "dur": 5_000, "tid": 1, "pid": 7}
    cpu = trace(events=[cpu_step, cpu_loader, collation, linear])
    done = import_trace(write(tmp_path / "cpu-rank0.json", cpu), "--db", db_url, "--run", "cpu-loader")
    assert done.returncode == 0, done.stderr
    spans = run_rows(
        db_url, "cpu-loader", "SELECT kind, start_ns, end_ns FROM spans WHERE run_id = {run} ORDER BY start_ns"
    )
    assert spans == [("data_loading", 100_000, 2_100_000), ("forward", 2_100_000, 7_100_000)], spans


def test_pipeline_actions_torch_annotates_give_spans_their_stage_and_micro_batch(db_url: str, tmp_path: Path) -> None:
    """A GPU trace of interleaved 1F1B's actions (``PP:{stage}{F|B|I|W}{mb}``): a kernel launched inside one is that
    action's work; with ``--schedule`` the run describes its pipeline; a schedule no one knows is refused."""
    steps = [
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": 100 * n, "dur": 100} for n in (1, 2)
    ]
    actions = [
        {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": 20}
        for name, ts in (("PP:3F1", 100), ("PP:3I1", 130), ("PP:3W1", 160), ("PP:3SEND_B1", 185))
    ]
    # the forward action launches two kernels: one span of the action, first start to last end (as collected)
    kernels = kernel(106, 2, "sm90_gemm", 6) + kernel(110, 5, "sm90_gemm", 1)
    kernels += kernel(140, 5, "sm90_gemm", 2) + kernel(170, 5, "sm90_gemm", 3)
    kernels += kernel(188, 4, "elementwise_kernel", 4) + kernel(230, 10, "elementwise_kernel", 5)
    path = write(tmp_path / "rank1.json", trace(rank=1, events=steps + actions + kernels))
    refused = import_trace(path, "--db", db_url, "--run", "pp", "--schedule", "2f2b")
    assert refused.returncode == 2 and "--schedule: unknown schedule '2f2b'" in refused.stderr, refused.stderr
    done = import_trace(path, "--db", db_url, "--run", "pp", "--schedule", "ScheduleInterleavedZeroBubble")
    assert done.returncode == 0, done.stderr
    # one rank's file, of stage 3 only: its actions are tagged, but no pipeline can be replayed from them
    assert "pipeline actions of stages 3: not every stage from 0" in done.stdout, done.stdout
    spans = run_rows(
        db_url,
        "pp",
        "SELECT step, kind, stage, microbatch, start_ns, end_ns FROM spans WHERE run_id = {run} ORDER BY start_ns",
    )
    assert spans[0] == (1, "forward", 3, 1, 106_000, 115_000), spans
    assert [row[:4] for row in spans] == [
        (1, "forward", 3, 1),
        (1, "backward_input", 3, 1),
        (1, "backward_weight", 3, 1),
        (1, "forward", None, None),  # launched outside any compute action (the send's): no stage's work
        (2, "forward", None, None),
    ], spans
    config = api(db_url, "/api/v1/runs/pp")["config"]
    assert "num_stages" not in config and "schedule" not in config, config


def test_a_single_stage_step_without_annotations_is_cut_at_its_p2p_calls() -> None:
    """The last stage of 1F1B as its CPU trace reads (ms): splitting the batch before the first recv, each
    micro-batch's forward and backward after a recv, the send's preparation after each backward, the gradients'
    scaling after the last; and a step whose forwards and backwards do not pair, left alone."""
    from bubblescope.trace_import import single_stage_chunks

    def at(kind: str, start: float, length: float) -> tuple[Any, ...]:
        return (kind, int(start * 1e6), int((start + length) * 1e6), None, None, None, None, None)

    step = [at("forward", 0, 0.4), at("recv", 0.4, 1.5)]
    for microbatch in range(3):
        t = 2 + 5 * microbatch
        step += [at("forward", t, 0.4), at("forward", t + 0.45, 0.3), at("backward", t + 0.8, 1.2)]
        step += [at("forward", t + 2.05, 0.01), at("send", t + 2.1, 0.2), at("recv", t + 2.3, 2)]
    step += [at("forward", 17.5, 0.2), at("optimizer", 17.8, 0.1)]
    tagged = [(s[0], s[1] // 1000, s[5], s[6]) for s in single_stage_chunks(step, 1) if s[5] is not None]
    assert tagged == [
        (kind, int((2 + 5 * mb + offset) * 1000), 1, mb)
        for mb in range(3)
        for kind, offset in (("forward", 0), ("forward", 0.45), ("backward", 0.8))
    ], tagged
    unpaired = [s for s in step if not (s[0] == "backward" and s[1] < 5e6)]  # the first micro-batch's backward lost
    assert single_stage_chunks(unpaired, 1) == unpaired


def test_a_kernel_on_its_own_stream_under_compute_is_overlapped_and_a_sub_group_keeps_its_name(
    db_url: str, tmp_path: Path
) -> None:
    """Rank 0 of 4: a GEMM on stream 7 at 110-210 us, an all-reduce of process group '3' (ranks 0 and 1, from
    ``pg_config``) on stream 9 at 160-260 us, and an all-gather of the default group (every rank) at 270-290 us.
    Overlap is read on the GPU's timeline across streams: 50 us of the all-reduce ran under the GEMM."""
    step = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 100, "dur": 200}]
    events = step + kernel(110, 100, "sm90_xmma_gemm", 1, stream=7)
    events += kernel(160, 100, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 2, stream=9)
    events += kernel(270, 20, "ncclDevKernel_AllGather_RING_LL", 3, stream=9)
    events[-3]["args"] |= {"Process Group Name": "3", "Process Group Ranks": "[0, 1]"}
    events[-1]["args"] |= {"Process Group Name": "0", "Process Group Ranks": "[0, 1, 2, 3]"}
    document = trace(0, events)
    document["distributedInfo"] = {
        "rank": 0,
        "world_size": 4,
        "pg_config": [{"pg_name": "0", "ranks": [0, 1, 2, 3]}, {"pg_name": "3", "ranks": [0, 1]}],
    }
    done = import_trace(write(tmp_path / "rank0.json", document), "--db", db_url, "--run", "streams")
    assert done.returncode == 0, done.stderr
    groups = dict(
        run_rows(db_url, "streams", "SELECT kind, \"group\" FROM spans WHERE run_id = {run} AND kind LIKE 'all_%'")
    )
    assert groups == {"all_reduce": "pg3", "all_gather": "world"}, groups
    (row,) = api(db_url, "/api/v1/runs/streams/steps/1")["breakdown"]
    assert row["overlapped_comm_ns"] == 50_000, row
    assert row["exposed_comm_ns"] == 50_000 + 20_000, row
