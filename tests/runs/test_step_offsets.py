"""Every step aggregate carries the clock offset in force for it, so the per-step totals need no join
to ``ranks``: the collector's own, else the rank's registered one (filled at ingest, at a late
registration, and by migration 0007 for rows stored before)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from bubblescope.backend.db import migrate
from tests.support import (
    LiveServer,
    create_postgres_database,
    drop_postgres_database,
    ingest_batch,
    post_gzip,
    postgres_unreachable_reason,
    register,
    run_rows,
)

AHEAD_NS = 3_000_000  # rank 1's clock runs 3 ms ahead of rank 0's


def _register_rank(client, key: str, rank: int, offset: int) -> None:  # type: ignore[no-untyped-def]
    body = {"host": "h", "pid": 100 + rank, "clock_offset_ns": offset}
    assert client.put(f"/api/v1/runs/{key}/ranks/{rank}", json=body).status_code == 200


def _step_offsets(db_url: str, key: str) -> dict[int, int | None]:
    rows = run_rows(db_url, key, "SELECT rank, clock_offset_ns FROM steps WHERE run_id = {run}")
    return {int(rank): offset for rank, offset in rows}


def test_a_step_without_its_own_offset_takes_the_ranks_at_ingest_or_at_a_late_registration(server: LiveServer) -> None:
    with server.client() as client:
        key = register(client, world_size=2)
        _register_rank(client, key, 0, 0)
        _register_rank(client, key, 1, AHEAD_NS)
        assert post_gzip(client, ingest_batch(key, rank=1)).status_code in (200, 202)
        assert _step_offsets(server.db_url, key) == {1: AHEAD_NS}
        # rank 0 sends before it registers: its step waits without an offset, then gets it
        late = register(client, world_size=2)
        assert post_gzip(client, ingest_batch(late, rank=0)).status_code in (200, 202)
        assert _step_offsets(server.db_url, late) == {0: None}
        _register_rank(client, late, 0, -AHEAD_NS)
        assert _step_offsets(server.db_url, late) == {0: -AHEAD_NS}
        # the step's wall is read on rank 0's clock: rank 1's identical local times sit 3 ms earlier
        assert post_gzip(client, ingest_batch(key, rank=0)).status_code in (200, 202)
        (step,) = client.get(f"/api/v1/runs/{key}").json()["steps"]
        span_ns = 50_000  # ingest_batch: 5 spans 10 µs apart
        assert step["ranks_reported"] == 2 and step["wall_ns"] == span_ns + AHEAD_NS


def test_a_step_that_sent_its_own_offset_keeps_it(server: LiveServer) -> None:
    with server.client() as client:
        key = register(client, world_size=1)
        _register_rank(client, key, 0, AHEAD_NS)
        batch = ingest_batch(key)
        batch["steps"][0]["clock_offset_ns"] = 7
        assert post_gzip(client, batch).status_code in (200, 202)
        assert _step_offsets(server.db_url, key) == {0: 7}


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_migration_0007_fills_the_offsets_of_steps_stored_before(backend: str, tmp_path: Path) -> None:
    if backend == "sqlite":
        url, name = f"sqlite:///{tmp_path / 'old.db'}", None
    else:
        if reason := postgres_unreachable_reason():
            pytest.skip(reason)
        url, name = create_postgres_database()
    try:
        migrate.upgrade(url, "0006")
        engine = create_engine(url)
        with engine.begin() as connection:
            connection.execute(
                text("INSERT INTO runs (id, key, name, world_size, config) VALUES (1, 'old', 'old', 2, '{}')")
            )
            for rank, offset in ((0, 0), (1, AHEAD_NS)):
                connection.execute(
                    text(
                        "INSERT INTO ranks (id, run_id, rank, host, pid, clock_offset_ns, clock_uncertainty_ns)"
                        " VALUES (:r + 1, 1, :r, 'h', 1, :o, 0)"
                    ),
                    {"r": rank, "o": offset},
                )
            for i, (rank, own) in enumerate(((0, None), (1, None), (1, 7))):
                step = 0 if own is None else 1
                connection.execute(
                    text(
                        "INSERT INTO steps (id, run_id, rank, step, start_ns, end_ns, compute_ns, comm_ns, exposed_comm_ns,"
                        " idle_ns, span_count, clock_offset_ns) VALUES (:i, 1, :r, :s, 0, 1, 1, 0, 0, 0, 0, :o)"
                    ),
                    {"i": i + 1, "r": rank, "s": step, "o": own},
                )
        migrate.upgrade(url)
        with engine.connect() as connection:
            rows = connection.execute(text("SELECT rank, step, clock_offset_ns FROM steps ORDER BY step, rank"))
            assert [tuple(row) for row in rows] == [(0, 0, 0), (1, 0, AHEAD_NS), (1, 1, 7)]
        engine.dispose()
    finally:
        if name is not None:
            drop_postgres_database(name)
