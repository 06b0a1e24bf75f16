"""A job killed with SIGKILL while the service is down, and a collector turned off.

Killed: the spool files written so far survive and ``bubblescope upload-spool`` delivers them;
what a writer killed mid-write leaves (a temporary file) and a corrupt file do not break it; the
run, never ended, turns silent.
Disabled: every collector call is a no-op, no thread starts, nothing is sent or spooled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tests.collector.jobs import launch, read_report, spooled_ingest_contents
from tests.collector.misbehaving_server import MisbehavingServer
from tests.support import LiveServer, count_rows, free_port, wait_until


def test_a_job_killed_while_the_server_is_down_leaves_a_spool_that_upload_spool_delivers(
    sqlite_server: LiveServer, tmp_path: Path
) -> None:
    run_key = f"killed-{uuid.uuid4().hex[:8]}"
    spool = tmp_path / "spool"
    dead = f"http://127.0.0.1:{free_port()}"
    env = {"BUBBLESCOPE_FLUSH_INTERVAL_S": "0.05", "BUBBLESCOPE_FULL_SPANS_EVERY": "1"}
    process, _ = launch(tmp_path, dead, run_key, "--steps", "1000000", "--work", "3000", env=env)
    try:
        wait_until(lambda: len(list(spool.rglob("*.msg"))) >= 8, 60, "eight spooled messages")
    finally:
        process.send_signal(signal.SIGKILL)
        assert process.wait(30) == -signal.SIGKILL
    steps, spans = spooled_ingest_contents(spool)
    assert steps == set(range(len(steps))) and spans == 20 * len(steps), "the spool should hold steps 0..k"

    rank_dir = next(spool.rglob("rank0"))
    newest = max(rank_dir.glob("*.msg"))
    leftover = rank_dir / f"{newest.name}.{process.pid}.tmp"  # as left by a kill mid-write
    leftover.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    old = time.time() - 3600
    os.utime(leftover, (old, old))
    corrupt = rank_dir / "00000000000000000001-1-00000000.msg"  # sorts first; no header line
    corrupt.write_bytes(b"\x1f\x8b garbage without a header line")

    upload = subprocess.run(
        [
            sys.executable,
            "-m",
            "bubblescope.cli",
            "upload-spool",
            "--url",
            sqlite_server.url,
            "--spool-dir",
            str(spool),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert upload.returncode == 0, upload.stdout + upload.stderr
    assert "rejected 0, still spooled 0" in upload.stdout, upload.stdout
    assert not leftover.exists() and corrupt.with_name(corrupt.name + ".bad").exists()
    with sqlite_server.client() as client:
        detail = client.get(f"/api/v1/runs/{run_key}").json()
    assert [step["step"] for step in detail["steps"]] == sorted(steps)
    assert count_rows(sqlite_server.db_url, "spans", run_key) == spans
    # Killed, it never reported an end: running while recently heard of, then silent.
    assert detail["state"] == "running" and detail["ranks"][0]["outcome"] is None
    time.sleep(2.2)  # SQLite stamps whole seconds
    with sqlite_server.client() as client:
        later = client.get(f"/api/v1/runs/{run_key}", params={"silent_after_s": 1}).json()
    assert later["state"] == "silent" and "1 of 1 ranks never reported an end" in later["state_detail"]


def test_disabled_collector_starts_no_thread_and_sends_nothing(sqlite_server: LiveServer, tmp_path: Path) -> None:
    run_key = f"disabled-{uuid.uuid4().hex[:8]}"
    server = MisbehavingServer("proxy", upstream=sqlite_server.url).start()  # counts every request
    try:
        process, _ = launch(
            tmp_path,
            server.url,
            run_key,
            "--steps",
            "200",
            "--baseline-steps",
            "100",
            "--work",
            "3000",
            env={"BUBBLESCOPE_DISABLED": "1", "BUBBLESCOPE_FLUSH_INTERVAL_S": "0.05"},
        )
        report = read_report(tmp_path, run_key, process)
        time.sleep(0.2)
    finally:
        server.stop()
    assert not report.enabled and report.dropped_spans is None
    assert report.threads_after_init == ["MainThread"], report.threads_after_init
    assert sum(server.requests.values()) == 0, server.requests
    assert not (tmp_path / "spool").exists()
    report.assert_loop_not_held_up()
    assert report.io_calls == {"on_training_thread": {}, "elsewhere": {}}, report.io_calls
    with sqlite_server.client() as client:
        assert client.get(f"/api/v1/runs/{run_key}").status_code == 404
