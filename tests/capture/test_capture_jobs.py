"""Capture-on-request end to end: two real rank processes sampling every 1000th step; a capture
request posted mid-run makes both ship full spans of exactly the same K steps. Junk in the
answers' capture requests is ignored."""

from __future__ import annotations

import uuid
from collections import defaultdict
from pathlib import Path

from sqlalchemy import create_engine, text

from tests.collector.jobs import launch, read_report
from tests.collector.misbehaving_server import JUNK_CAPTURES, MisbehavingServer
from tests.support import LiveServer, newest_step_of_every_rank, wait_until

STEPS, CAPTURE_STEPS, SPANS = 160, 20, 20  # 20 ms steps: the capture is asked for near step 30


def steps_with_spans_per_rank(db_url: str, run_key: str) -> dict[int, dict[int, int]]:
    """rank -> step -> number of spans stored."""
    engine = create_engine(db_url)
    query = text(
        "SELECT s.rank, s.step, count(*) FROM spans s JOIN runs r ON r.id = s.run_id "
        "WHERE r.key = :key GROUP BY s.rank, s.step"
    )
    try:
        with engine.connect() as connection:
            rows = connection.execute(query, {"key": run_key}).all()
    finally:
        engine.dispose()
    result: dict[int, dict[int, int]] = defaultdict(dict)
    for rank, step, count in rows:
        result[rank][step] = count
    return dict(result)


def test_a_capture_request_mid_run_gives_every_rank_full_spans_of_the_same_k_steps(
    server: LiveServer, tmp_path: Path
) -> None:
    run_key = f"capture-{uuid.uuid4().hex[:8]}"
    loop = [
        "--steps",
        str(STEPS),
        "--spans",
        str(SPANS),
        "--work",
        "300",
        "--sleep-s",
        "0.02",
        "--full-spans-every",
        "1000",
    ]
    processes = []
    for rank in (0, 1):
        env = {"RANK": str(rank), "WORLD_SIZE": "2", "BUBBLESCOPE_FLUSH_INTERVAL_S": "0.1"}
        rank_dir = tmp_path / f"rank{rank}"
        rank_dir.mkdir()
        processes.append((rank_dir, launch(rank_dir, server.url, run_key, *loop, env=env)[0]))
    try:
        wait_until(lambda: newest_step_of_every_rank(server, run_key) >= 30, 60, "both ranks past step 30")
        with server.client() as client:
            response = client.post(f"/api/v1/runs/{run_key}/capture", json={"steps": CAPTURE_STEPS})
        assert response.status_code == 201, response.text
        request = response.json()
    finally:
        for rank_dir, process in processes:
            read_report(rank_dir, run_key, process)
    first = request["from_step"]
    assert request["steps"] == CAPTURE_STEPS and first > 30 and first + CAPTURE_STEPS <= STEPS, request

    expected = {0} | set(range(first, first + CAPTURE_STEPS))  # step 0 by the every-1000th sampling
    stored = steps_with_spans_per_rank(server.db_url, run_key)
    for rank in (0, 1):
        assert set(stored.get(rank, {})) == expected, (rank, request, sorted(stored.get(rank, {})))
        assert all(count == SPANS for count in stored[rank].values()), stored[rank]
    with server.client() as client:
        detail = client.get(f"/api/v1/runs/{run_key}").json()
    assert {s["step"] for s in detail["steps"] if s["has_spans"]} == expected
    assert len(detail["steps"]) == STEPS and all(s["ranks_reported"] == 2 for s in detail["steps"])


def test_junk_in_the_capture_answers_is_ignored(sqlite_server: LiveServer, tmp_path: Path) -> None:
    """Every ingest answer's ``captures`` replaced by junk (wrong types, negative or huge steps,
    booleans, a string): the job runs on, nothing is captured, every step arrives."""
    run_key = f"junk-captures-{uuid.uuid4().hex[:8]}"
    server = MisbehavingServer("bad_captures", upstream=sqlite_server.url).start()
    try:
        process, _ = launch(
            tmp_path,
            server.url,
            run_key,
            "--steps",
            "150",
            "--work",
            "300",
            "--sleep-s",
            "0.005",
            "--full-spans-every",
            "1000",
            env={"BUBBLESCOPE_FLUSH_INTERVAL_S": "0.03"},
        )
        report = read_report(tmp_path, run_key, process)
    finally:
        server.stop()
    assert server.requests["junk"] >= len(JUNK_CAPTURES), server.requests
    assert "error" not in (tmp_path / f"{run_key}.log").read_text()
    with sqlite_server.client() as client:
        steps = client.get(f"/api/v1/runs/{run_key}").json()["steps"]
    assert [s["step"] for s in steps] == list(range(150)) and report.dropped_spans == 0
    assert [s["step"] for s in steps if s["has_spans"]] == [0]
