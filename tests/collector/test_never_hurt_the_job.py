"""The collector never hurts the job, whatever the server does.

Each case runs the hand-written loop (``tests.collector.hand_loop``) in its own process against
a real misbehaving HTTP server (``misbehaving_server``) and checks: the training thread makes no
network call, spool write, sleep or wait on the collector's behalf (the shipper thread makes
them) and its CPU per step stays that of the same loop uninstrumented (``LoopReport.
assert_loop_not_held_up``; the wall-time figures are ``bench/collector_faults.py``'s), nothing
raises into the loop, batches spool to disk up to the
bound, they reach the real service (SQLite, through the API) once it is back, and every span
recorded is either stored or counted as dropped, and that count is shown by the API.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from bubblescope.collector import upload_spool
from bubblescope.collector.spool import COUNTERS_NAME
from tests.collector.jobs import LoopReport, launch, read_report, spooled_ingest_contents
from tests.collector.misbehaving_server import MisbehavingServer
from tests.support import LiveServer, count_rows, wait_until

pytestmark = pytest.mark.timing  # the job's shutdown and lifetime against the collector's timeouts

STEPS, BASELINE_STEPS, SWITCH_AT = 500, 250, 100
# ~0.6 ms of Python a step and a 3 ms sleep (a loop that waits on its device, as training does): the
# loop lasts ~2.7 s, of which the switch (after ~0.5 s of loop, three failed attempts and a spooled
# batch) takes under 1.5 s, so the loop still runs when the service comes back; at a sixth of the
# CPU that computing all of it took. The baseline steps serve the CPU comparison only.
LOOP = ["--steps", str(STEPS), "--baseline-steps", str(BASELINE_STEPS), "--work", "2000", "--sleep-s", "0.003"]
SHORT_LOOP = ["--steps", "200", "--baseline-steps", "100", "--work", "2000", "--sleep-s", "0.003"]
SPOOL_BOUND = 6 * 1024  # smaller than the first backlog batch (~12 bytes a span, 20 spans a step)
FAST_FAILING = {
    "BUBBLESCOPE_FLUSH_INTERVAL_S": "0.1",
    # These servers fail at once; the timeout only bounds answers relayed from the real service,
    # which on a loaded machine can take a second (a request cut short may still have been stored).
    "BUBBLESCOPE_REQUEST_TIMEOUT_S": "3",
    "BUBBLESCOPE_SPOOL_MAX_BYTES": str(SPOOL_BOUND),
    "BUBBLESCOPE_FULL_SPANS_EVERY": "1",  # every span travels, so stored + dropped must add up
}


def spooled_messages(spool: Path) -> list[Path]:
    return [path for path in spool.rglob("*.msg") if path.name != COUNTERS_NAME]


def run_detail(server: LiveServer, run_key: str) -> dict:
    with server.client() as client:
        response = client.get(f"/api/v1/runs/{run_key}")
    assert response.status_code == 200, response.text
    return response.json()


def assert_every_span_stored_or_counted(server: LiveServer, run_key: str, report: LoopReport) -> int:
    """Stored spans (DB) + dropped (API) == recorded; the API shows the job's own count."""
    dropped = sum(rank["dropped_spans"] for rank in run_detail(server, run_key)["ranks"])
    stored = count_rows(server.db_url, "spans", run_key)
    assert dropped == report.dropped_spans, (dropped, report.figures())
    assert stored + dropped == report.spans_recorded, (stored, dropped, report.figures())
    return dropped


@pytest.mark.parametrize("mode", ["error", "garbage", "wrong_json", "drop", "half"])
def test_a_misbehaving_server_costs_no_step_time_and_the_data_arrives_once_it_is_back(
    mode: str, sqlite_server: LiveServer, tmp_path: Path
) -> None:
    """(b) 500s, (c) 200 with non-JSON / with the wrong JSON, (d) connection dropped after the
    headers / half an answer. The server is switched to the real service half-way through."""
    run_key = f"misbehave-{mode}-{uuid.uuid4().hex[:8]}"
    signal, spool = tmp_path / "switch", tmp_path / "spool"
    server = MisbehavingServer(mode, upstream=sqlite_server.url).start()
    try:
        process, _ = launch(
            tmp_path,
            server.url,
            run_key,
            *LOOP,
            "--signal-at",
            str(SWITCH_AT),
            "--signal-file",
            str(signal),
            env=FAST_FAILING,
        )
        wait_until(signal.exists, 120, "the loop to reach the switch")
        # Three failed attempts (0.6 s of pauses between them), then the spool takes over.
        wait_until(lambda: spooled_ingest_contents(spool)[0], 30, "a spooled batch of steps")
        spooled_steps, _ = spooled_ingest_contents(spool)
        assert server.requests[mode] > 0, "the misbehaviour was never exercised"
        assert sum(path.stat().st_size for path in spooled_messages(spool)) <= SPOOL_BOUND
        server.mode = "proxy"  # the real service is back
        report = read_report(tmp_path, run_key, process)
    finally:
        server.stop()
    print(f"{mode}: {report.figures()}")
    report.assert_loop_not_held_up()
    io_elsewhere = report.io_calls["elsewhere"]  # the shipper thread did the I/O, spool writes included
    assert io_elsewhere.get("socket.connect", 0) > 0 and io_elsewhere.get("os.replace", 0) > 0, report.figures()
    assert server.requests["proxy"] > 0
    dropped = assert_every_span_stored_or_counted(sqlite_server, run_key, report)
    assert dropped > 0, "the spool bound should have been hit while the server misbehaved"
    steps = {step["step"] for step in run_detail(sqlite_server, run_key)["steps"]}
    assert spooled_steps <= steps, "the steps spooled while the server misbehaved should be re-sent"
    assert STEPS - 1 in steps
    assert not spooled_messages(spool), "the spool should be drained once the service is back"


def test_a_server_that_answers_after_30_s_is_cut_off_by_the_request_timeout_and_shutdown_is_bounded(
    sqlite_server: LiveServer, tmp_path: Path
) -> None:
    """(a) A server that takes 30 s per answer, with the default 5 s request timeout: the loop is
    not slowed, ``shutdown`` returns within its bound while a request hangs, and the spool
    delivers everything to the real service afterwards."""
    shutdown_timeout_s, request_timeout_s = 2.0, 5.0
    run_key = f"slow-{uuid.uuid4().hex[:8]}"
    server = MisbehavingServer("slow", slow_s=30.0).start()
    env = {
        "BUBBLESCOPE_FLUSH_INTERVAL_S": "0.1",
        "BUBBLESCOPE_FULL_SPANS_EVERY": "1",
        "BUBBLESCOPE_SHUTDOWN_TIMEOUT_S": str(shutdown_timeout_s),
    }
    try:
        started = time.monotonic()
        process, _ = launch(tmp_path, server.url, run_key, *SHORT_LOOP, env=env)
        report = read_report(tmp_path, run_key, process)
        lifetime_s = time.monotonic() - started
        assert server.requests["slow"] >= 1
    finally:
        server.stop()
    print(f"slow: {report.figures()}; process lived {lifetime_s:.2f} s")
    report.assert_loop_not_held_up()
    assert report.io_calls["elsewhere"].get("socket.recv_into", 0) > 0, report.figures()  # a hung read, elsewhere
    bound_s = shutdown_timeout_s + request_timeout_s + 1.0
    assert report.shutdown_s <= bound_s, report.figures()
    # The whole process: the loop, the bounded shutdown, and interpreter start and exit (margin).
    assert lifetime_s <= report.loop_s + bound_s + 10.0, (lifetime_s, report.figures())
    assert not report.shipper_alive, "the shipper thread should have finished within the bound"
    assert report.dropped_spans == 0

    result = upload_spool(tmp_path / "spool", sqlite_server.url)
    assert result.remaining == 0 and result.rejected == 0 and result.delivered > 0
    detail = run_detail(sqlite_server, run_key)
    assert [s["step"] for s in detail["steps"]] == list(range(200))
    assert detail["state"] == "finished", detail["state_detail"]  # the end, spooled at shutdown, came last
    assert_every_span_stored_or_counted(sqlite_server, run_key, report)
