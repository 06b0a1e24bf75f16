"""The collector API inside one process, against a real server and against none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support import REPO, LiveServer, free_port

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from bubblescope import collector
    from tests.collector.io_probe import IoProbe
    probe = IoProbe().install()
    collector.init(run="hand written", url=sys.argv[1], spool_dir=sys.argv[2], run_key=sys.argv[3])
    probe.open = True
    for step in range(20):
        with collector.step():
            for mb in range(4):
                with collector.span("forward", microbatch=mb, stage=0):
                    sum(range(2000))
                with collector.span("backward", microbatch=mb, stage=0):
                    sum(range(4000))
            with collector.span("not-a-kind"):
                pass
    probe.open = False
    collector.shutdown()
    print("io-calls", json.dumps(probe.report()))
    """
)


def run_script(url: str, spool: Path, run_key: str) -> tuple[int, str, float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, url, str(spool), run_key], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def test_hand_written_spans_arrive_with_names_and_unknown_kinds_are_dropped(
    sqlite_server: LiveServer, tmp_path: Path
) -> None:
    began_ns = time.time_ns()
    code, output, _ = run_script(sqlite_server.url, tmp_path / "spool", "hand-written-1")
    assert code == 0, output
    assert "unknown span kind 'not-a-kind'" in output
    with sqlite_server.client() as client:
        detail = client.get("/api/v1/runs/hand-written-1").json()
        assert detail["name"] == "hand written" and len(detail["steps"]) == 20
        # The default sampling: aggregates of every step, full spans of every 10th.
        assert [s["step"] for s in detail["steps"] if s["has_spans"]] == [0, 10]
        step = client.get("/api/v1/runs/hand-written-1/steps/10").json()
    # Recorded on the process's monotonic clock, shipped as epoch time.
    assert began_ns < step["origin_ns"] < time.time_ns(), (began_ns, step["origin_ns"])
    kinds = sorted(s["kind"] for s in step["spans"])
    assert kinds == ["backward"] * 4 + ["forward"] * 4
    assert sorted(s["microbatch"] for s in step["spans"] if s["kind"] == "forward") == [0, 1, 2, 3]


def test_unreachable_server_neither_raises_nor_holds_the_steps_up(tmp_path: Path) -> None:
    """With nothing listening, the loop runs on: no exception, and the collector makes no network
    call, spool write, sleep or wait on the training thread during the steps (``io_probe``: a
    connection attempt, a retry pause or a spool write on that thread fails this whatever the
    machine's load); the shipper thread tries to connect and spools."""
    dead = f"http://127.0.0.1:{free_port()}"
    code, output, wall = run_script(dead, tmp_path / "spool", "offline-1")
    assert code == 0, output
    calls = json.loads(output.split("io-calls", 1)[1].splitlines()[0])
    assert calls["on_training_thread"] == {}, calls
    assert calls["elsewhere"].get("socket.connect", 0) > 0 and calls["elsewhere"].get("os.replace", 0) > 0, calls
    assert wall < 30  # a hang guard: interpreter start, 20 short steps, a shutdown with nothing to wait for
    assert list((tmp_path / "spool").rglob("*.msg"))


RESUME_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from bubblescope import collector
    collector.init(run="resume", url=sys.argv[1], spool_dir=sys.argv[2], run_key="resume-1")
    for step in range(60):
        with collector.step():
            with collector.span("forward", microbatch=0, stage=0):
                time.sleep(0.05)
        if step == 10:  # the first steps are spooled by now; train on once the server is up
            Path(sys.argv[3]).write_text("server may start")
            deadline = time.monotonic() + 60
            while not Path(sys.argv[4]).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
    collector.shutdown()
    """
)


def test_spooled_steps_are_sent_once_the_server_is_back_during_the_job(tmp_path: Path) -> None:
    from bubblescope.backend.db import migrate
    from tests.support import start_server

    port = free_port()
    signal, server_up = tmp_path / "signal", tmp_path / "server-up"
    job = subprocess.Popen(
        [
            sys.executable,
            "-c",
            RESUME_SCRIPT,
            f"http://127.0.0.1:{port}",
            str(tmp_path / "spool"),
            str(signal),
            str(server_up),
        ],
        env={**os.environ, "BUBBLESCOPE_FLUSH_INTERVAL_S": "0.1"},
    )
    deadline = time.monotonic() + 60
    while not signal.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    while not list((tmp_path / "spool").rglob("*.msg")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list((tmp_path / "spool").rglob("*.msg")), "the first steps should have been spooled"
    db_url = f"sqlite:///{tmp_path / 'late.db'}"
    migrate.upgrade(db_url)
    server = start_server(db_url, tmp_path, port=port)
    server_up.write_text("up")
    try:
        assert job.wait(120) == 0
        with server.client() as client:
            steps = client.get("/api/v1/runs/resume-1").json()["steps"]
        assert [s["step"] for s in steps] == list(range(60))
        assert not list((tmp_path / "spool").rglob("*.msg")), "the spool should be drained"
    finally:
        server.stop()


PAUSED_SCRIPT = textwrap.dedent(
    """
    import contextlib, sys
    import torch, torch.distributed as dist
    from bubblescope import collector
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[3]}", rank=0, world_size=1)
    collector.init(run="paused", url=sys.argv[1], spool_dir=sys.argv[2], run_key="paused-1",
                   full_spans_every=1)
    for step in range(6):
        evaluating = step in (2, 3)
        with collector.paused() if evaluating else contextlib.nullcontext():
            with collector.step():  # inside paused: not a step
                with collector.span("forward", microbatch=step, stage=0):
                    sum(range(1000))
                dist.all_reduce(torch.ones(4))  # inside paused: no span either
    collector.shutdown()
    dist.destroy_process_group()
    """
)


@pytest.mark.slow  # a torch process running a collective (gloo, a world of one)
def test_paused_blocks_record_no_step_span_or_collective(sqlite_server: LiveServer, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PAUSED_SCRIPT, sqlite_server.url, str(tmp_path / "spool"), str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with sqlite_server.client() as client:
        steps = client.get("/api/v1/runs/paused-1").json()["steps"]
        assert [s["step"] for s in steps] == [0, 1, 2, 3]  # 6 loop steps, 2 of them paused
        spans = {s["step"]: client.get(f"/api/v1/runs/paused-1/steps/{s['step']}").json()["spans"] for s in steps}
    for step, recorded in spans.items():
        assert sorted((s["kind"], s["microbatch"]) for s in recorded) == sorted(
            [("all_reduce", None), ("forward", step if step < 2 else step + 2)]
        ), (step, recorded)
