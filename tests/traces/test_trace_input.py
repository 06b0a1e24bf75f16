"""``bubblescope trace-summary`` on traces written here, and on bad ones: each bad file gets one line that names the
file and what is wrong, exit status 2, no traceback."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bubblescope.analysis.trace_figures import hta_figures
from bubblescope.kineto import TraceError, read_rank_trace
from tests.traces.support import job_files
from tests.traces.written import kernel, trace, two_stage_p2p_traces, write


def summary(*paths: Path, json_out: bool = False) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "bubblescope.cli",
        "trace-summary",
        *map(str, paths),
        *(["--json"] if json_out else []),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_a_written_trace_is_read_as_hta_reads_it(tmp_path: Path) -> None:
    """The last profiler step is left out; compute 30 of the 60 us span, the all-reduce's 40 us half overlapped."""
    done = summary(write(tmp_path / "rank0.json", trace()), json_out=True)
    assert done.returncode == 0, done.stderr
    (rank,) = json.loads(done.stdout)
    assert (
        rank["rank"] == 0
        and rank["kernel_span_us"] == 60
        and rank["profiler_steps"] == ["ProfilerStep#1", "ProfilerStep#2"]
    )
    assert rank["hta"]["compute_pct"] == 50.0 and rank["hta"]["idle_pct"] == 0.0
    assert rank["hta"]["comm_overlap_pct"] == 25.0  # 30-40 of 30-70
    assert rank["ours"]["communication_pct"] == 200 / 3 and rank["ours"]["exposed_communication_pct"] == 50.0


def test_fractional_times_are_rounded_inwards_as_hta_does(tmp_path: Path) -> None:
    events = trace()["traceEvents"]
    events[2]["ts"], events[3]["ts"], events[3]["dur"] = 104.6, 109.6, 30.8  # the GEMM: 109.6-140.4 -> 110-140
    found = read_rank_trace(write(tmp_path / "rank0.json.gz", trace(events=events), compress=True))
    gemm = next(a for a in found.activities if a.name == "sm80_gemm")
    assert (gemm.start, gemm.end, gemm.launched_at) == (110, 140, 105)
    assert hta_figures(found.activities).kernel_span_us == 60


def test_a_real_trace_reads_the_same_plain_and_gzipped(tmp_path: Path) -> None:
    (path,) = job_files("nccl_data_rank0_of2_a100")
    plain = write(tmp_path / "rank0.json", gzip.decompress(path.read_bytes()).decode())
    assert read_rank_trace(plain).activities == read_rank_trace(path).activities


def test_the_rank_comes_from_the_trace_else_the_file_name_else_a_message_says_how_to_name_it(tmp_path: Path) -> None:
    named = summary(write(tmp_path / "worker_rank-5.json", trace(rank=None)), json_out=True)
    assert named.returncode == 0 and json.loads(named.stdout)[0]["rank"] == 5, named.stderr
    anonymous = summary(write(tmp_path / "trace.json", trace(rank=None)))
    assert anonymous.returncode == 2 and "no rank" in anonymous.stderr and "rank3.json.gz" in anonymous.stderr
    assert "Traceback" not in anonymous.stderr


def test_bad_traces_get_one_line_each(tmp_path: Path) -> None:
    whole = gzip.compress(json.dumps(trace()).encode())
    truncated = tmp_path / "cut_rank0.json.gz"
    truncated.write_bytes(whole[: len(whole) // 2])
    cases = {
        "truncated gzip": (truncated, "cannot be read to its end"),
        "not JSON": (write(tmp_path / "rank0.json", "<html>not a trace</html>"), "expected '{'"),
        "cut JSON": (write(tmp_path / "half_rank0.json", json.dumps(trace())[:300]), "not a whole JSON trace"),
        "no events": (write(tmp_path / "empty_rank0.json", {"distributedInfo": {"rank": 0}}), "no traceEvents"),
        "no GPU": (write(tmp_path / "cpu_rank0.json", trace(events=trace()["traceEvents"][:2])), "no GPU kernels"),
    }
    for what, (path, said) in cases.items():
        done = summary(path)
        assert done.returncode == 2, (what, done.stdout)
        assert said in done.stderr and str(path) in done.stderr and "Traceback" not in done.stderr, (what, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, (what, done.stderr)


def test_two_files_of_one_rank_are_refused_naming_both(tmp_path: Path) -> None:
    first, second = write(tmp_path / "a.json", trace(rank=1)), write(tmp_path / "b.json", trace(rank=1))
    done = summary(first, second)
    assert done.returncode == 2 and str(first) in done.stderr and str(second) in done.stderr and "rank 1" in done.stderr


def test_the_standard_librarys_decoder_reads_what_orjson_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """orjson is optional (the server's extras): without it the chunks of events are decoded by json, the same."""
    from bubblescope import kineto

    (path,) = job_files("trace_diff_control_rank3_of8_a100")
    fast = read_rank_trace(path)
    monkeypatch.setattr(kineto, "_decode_list", kineto._stdlib_decode)
    slow = read_rank_trace(path)
    assert slow.activities == fast.activities and slow.events == fast.events == 109_123


def test_a_trace_written_without_indentation_or_ph_first_is_read_whole(tmp_path: Path) -> None:
    """The fast path cuts after a ``}, {"ph"``; events written another way are read one by one, all of them."""
    events = [{"name": f"op{i}", "ph": "X", "cat": "cpu_op", "ts": i, "dur": 1} for i in range(30_000)]
    events += trace()["traceEvents"]
    plain = write(tmp_path / "rank0.json", json.dumps({"traceEvents": events}, separators=(",", ":")))
    assert read_rank_trace(plain).events == len(events)


@pytest.mark.parametrize(
    ("command", "prefix"), [("import-trace", "bubblescope-trace-"), ("trace-summary", "bubblescope-summary-")]
)
def test_a_command_stopped_by_sigterm_leaves_no_temporary_files(tmp_path: Path, command: str, prefix: str) -> None:
    """A trace of 120,000 kernels, read into its temporary folder; SIGTERM once the folder is there: the command
    exits 143 and the folder is gone."""
    import signal
    import time

    events = [
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": n * 10_000, "dur": 10_000}
        for n in range(12)
    ]
    for index in range(120_000):
        events += kernel(100 + index, 0.5, "sm80_gemm", index + 1)
    path = write(tmp_path / "rank0.json", trace(events=events))
    spill = tmp_path / "tmp"
    spill.mkdir()
    extra = ["--db", f"sqlite:///{tmp_path / 'runs.db'}"] if command == "import-trace" else []
    process = subprocess.Popen(
        [sys.executable, "-m", "bubblescope.cli", command, str(path), *extra],
        env={**os.environ, "TMPDIR": str(spill)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not any(p.name.startswith(prefix) for p in spill.iterdir()):
        assert process.poll() is None and time.monotonic() < deadline, "the command ended before its folder was seen"
        time.sleep(0.01)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 143, process.stderr.read() if process.stderr else ""
    assert [p.name for p in spill.iterdir()] == [], "temporary files left behind"


@pytest.mark.parametrize("job", ["nccl_data_rank0_of2_a100", "trace_diff_control_rank3_of8_a100", "h100_ddp_from_docs"])
def test_a_summary_read_back_from_disk_has_the_figures_of_one_held_in_memory(
    job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``trace-summary`` keeps a large trace's activities in SQLite past ``IN_MEMORY_ROWS`` (here 50) and reads
    them back in order: the same figures, to the microsecond, as the activities held in a list."""
    from bubblescope import kineto
    from bubblescope.analysis.trace_figures import own_split
    from bubblescope.trace_summary import summarize

    (path,) = job_files(job)
    trace = read_rank_trace(path)
    monkeypatch.setattr(kineto._SpilledCollected, "IN_MEMORY_ROWS", 50)
    (summary,) = summarize([path])
    assert len(trace.activities) > 50
    assert summary.hta == hta_figures(trace.activities) and summary.ours == own_split(trace.activities)


@pytest.mark.parametrize("in_memory_rows", [1, 100_000])
def test_the_summary_reads_rounded_ties_empty_activities_and_hostile_values_as_the_list_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_memory_rows: int
) -> None:
    """Fractional times on one stream whose rounded starts tie (11 for 10.7 and 10.2: HTA keeps the trace's order,
    not the raw times'), an activity rounded to nothing (0.6-0.9 -> 1-0), and a collective named by a list: the
    summary, read back from disk (1 row in memory) or not, gives the list's figures; a time past 64 bits is one line
    naming the file, not a traceback."""
    from bubblescope import kineto
    from bubblescope.analysis.trace_figures import own_split
    from bubblescope.trace_summary import summarize

    monkeypatch.setattr(kineto._SpilledCollected, "IN_MEMORY_ROWS", in_memory_rows)
    events = kernel(10.7, 5, "sm80_gemm", 1) + kernel(10.2, 1, "elementwise_kernel", 2) + kernel(30.6, 0.3, "tiny", 3)
    events += kernel(40.5, 20.25, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 4, stream=9)
    events[-1]["args"]["Collective name"] = []
    path = write(tmp_path / "rank0.json", trace(events=events))
    (summary,) = summarize([path])
    listed = read_rank_trace(path).activities
    assert summary.hta == hta_figures(listed) and summary.ours == own_split(listed), (summary, listed)
    assert summary.hta.kernel_span_us == 60 - 11  # the empty activity (31-30) is no part of the span

    events[0]["ts"] = 2**64
    with pytest.raises(TraceError, match=f"{path}: an event at ts .*past what can be stored"):
        summarize([write(path, trace(events=events))])


def test_the_summary_counts_a_recvs_wait_for_its_peers_send_in_a_column_of_its_own(tmp_path: Path) -> None:
    """HTA counts a recv kernel whole as communication; its time before the peer's send began is a wait for the
    previous stage, which the summary gives apart (``recv wait``): 43 us on rank 1, none on rank 0, and '-' for a
    rank whose peer's trace is not given."""
    files = [write(tmp_path / f"rank{r}.json", trace(r, events)) for r, events in two_stage_p2p_traces().items()]
    done = subprocess.run(
        [sys.executable, "-m", "bubblescope.cli", "trace-summary", *map(str, files), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    rows = {row["rank"]: row for row in json.loads(done.stdout)}
    ours = {rank: row["ours"] for rank, row in rows.items()}
    assert ours[1]["p2p_wait_us"] == 43 and ours[0]["p2p_wait_us"] is None, ours
    # the difference named: HTA's non-compute holds both recvs whole (50 + 23 us), 43 us of which we call a wait
    assert rows[1]["hta"]["non_compute_us"] == 73 and ours[1]["communication_us"] == 73, rows[1]
    alone = subprocess.run(
        [sys.executable, "-m", "bubblescope.cli", "trace-summary", str(files[1])], capture_output=True, text=True
    )
    assert alone.returncode == 0 and "recv wait" in alone.stdout, alone.stderr
    assert alone.stdout.splitlines()[1].rstrip().endswith("-"), alone.stdout
