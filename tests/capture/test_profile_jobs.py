"""A profiler on demand, end to end: the docs' plain DDP loop (``bench/ddp_from_docs.py``, 2 gloo ranks) streams
into a real service; ``POST /runs/{key}/profile`` mid-run makes every rank run torch.profiler over the same steps,
write its trace beside its spool and upload it, and the service lists it as a run of those steps. The profiler's
decisions, without a job: what it does when the job has no torch, and with junk windows."""

from __future__ import annotations

import gzip
import json
import logging
import sys
import threading
import uuid
from pathlib import Path

import pytest

from bubblescope.collector.capture import CaptureWindows, ProfileWindow
from bubblescope.collector.profiling import OnDemandProfiler
from tests.support import JobResult, LiveServer, newest_step_of_every_rank, run_rows, run_torchrun, wait_until

STEPS, PROFILED = 600, 3


@pytest.mark.slow
def test_a_profile_request_mid_run_profiles_the_same_steps_on_every_rank(
    sqlite_server: LiveServer, tmp_path: Path
) -> None:
    run_key = f"profiled-{uuid.uuid4().hex[:8]}"
    spool = tmp_path / "spool"
    result: list[JobResult] = []
    job = threading.Thread(
        target=lambda: result.append(
            run_torchrun(
                sqlite_server.url,
                "bench/ddp_from_docs.py",
                2,
                "--run-name=profiled",
                f"--steps={STEPS}",
                "--hidden=1024",
                run_key=run_key,
                extra_env={"BUBBLESCOPE_SPOOL_DIR": str(spool)},
            )
        )
    )
    job.start()
    try:
        wait_until(
            lambda: newest_step_of_every_rank(sqlite_server, run_key) >= 20 or not job.is_alive(),
            120,
            "both ranks past 20",
        )
        with sqlite_server.client() as client:
            asked = client.post(f"/api/v1/runs/{run_key}/profile", json={"steps": PROFILED})
        assert asked.status_code == 201, asked.text
    finally:
        job.join(300)
    (done,) = result
    assert done.returncode == 0, done.output[-3000:]
    first = asked.json()["from_step"]
    last = first + PROFILED - 1
    assert last < STEPS, asked.json()  # the job ran past the profiled steps
    folder = tmp_path / "profiles" / run_key
    traces = sorted(folder.glob("*.json.gz"))
    assert [t.name for t in traces] == [f"rank{r}-steps{first}-{last}.json.gz" for r in (0, 1)], done.output[-2000:]
    for trace in traces:
        names = {e.get("name") for e in json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]}
        assert {f"ProfilerStep#{s}" for s in range(first, last + 1)} <= names, trace
    with sqlite_server.client() as client:  # ranks 0 and 1 (the first 8) uploaded theirs, imported as a run
        (profile,) = client.get(f"/api/v1/runs/{run_key}/profiles").json()["profiles"]
    assert [(t["rank"], t["file"]) for t in profile["traces"]] == [(r, traces[r].name) for r in (0, 1)], profile
    steps = run_rows(
        sqlite_server.db_url, profile["run_key"], "SELECT DISTINCT rank, step FROM steps WHERE run_id = {run}"
    )
    assert sorted(steps) == [(rank, step) for rank in (0, 1) for step in range(first, last + 1)]


def windows(*requests: object) -> CaptureWindows:
    learnt = CaptureWindows()
    learnt.learn({"captures": list(requests)})
    return learnt


def test_profile_requests_are_windows_of_their_own_and_junk_is_ignored() -> None:
    learnt = windows(
        {"id": 1, "from_step": 10, "steps": 3, "kind": "profile", "upload_ranks": [0, 3, "1", -2, True]},
        {"id": 2, "from_step": 10, "steps": 5},
        {"id": 3, "from_step": "12", "steps": 3, "kind": "profile"},
        {"id": 4, "from_step": 20, "steps": 0, "kind": "profile"},
    )
    assert learnt.profile_ranges == (ProfileWindow(10, 13, 1, frozenset({0, 3})),) and learnt.ranges == ((10, 15),)
    assert not learnt.covers(16) and learnt.covers(12)


def test_a_job_without_torch_says_so_and_drops_the_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    profiler = OnDemandProfiler(windows({"id": 1, "from_step": 5, "steps": 2, "kind": "profile"}), tmp_path, 0)
    monkeypatch.setitem(sys.modules, "torch", None)
    with caplog.at_level(logging.WARNING, logger="bubblescope"):
        for step in range(4, 9):
            profiler.between_steps(step)
    assert "does not use torch: dropped" in caplog.text and list(tmp_path.iterdir()) == []
