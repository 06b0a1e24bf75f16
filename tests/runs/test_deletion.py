"""DELETE /api/v1/runs/{key} on SQLite and PostgreSQL: every row of the run goes, nothing of another
run; the big tables in chunks; 404 naming the key of a run that is not there."""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from bubblescope.backend.db.engine import build_engine, build_session_factory
from bubblescope.backend.runs.deletion import CHUNKED_TABLES, delete_run_rows
from tests.runs.run_rows import full_run, rows_of_run, run_id_of, tables_of_a_run
from tests.support import LiveServer, assert_names


def test_the_schema_walk_finds_every_table_of_a_run() -> None:
    names = {table.name for table, _column, _via in tables_of_a_run()}
    assert {"ranks", "steps", "spans", "ingested_batches", "capture_requests", "alerts", "alert_deliveries"} <= names
    assert "profile_traces" in names


def test_deleting_a_run_removes_all_its_rows_and_none_of_another(server: LiveServer) -> None:
    with server.client() as client:
        doomed, kept = full_run(client, server.db_url), full_run(client, server.db_url)
        doomed_id, kept_id = run_id_of(server.db_url, doomed), run_id_of(server.db_url, kept)
        before = rows_of_run(server.db_url, doomed_id)
        assert all(count > 0 for count in before.values()), before  # a row in every table to delete
        kept_before = rows_of_run(server.db_url, kept_id)

        deleted = client.delete(f"/api/v1/runs/{doomed}")
        assert deleted.status_code == 204 and deleted.content == b""
        assert set(rows_of_run(server.db_url, doomed_id).values()) == {0}
        assert rows_of_run(server.db_url, kept_id) == kept_before
        assert_names(client.get(f"/api/v1/runs/{doomed}"), 404, ["path", "run_key"], doomed)
        assert client.get(f"/api/v1/runs/{kept}").status_code == 200

        again = client.delete(f"/api/v1/runs/{doomed}")
        assert_names(again, 404, ["path", "run_key"], f"no run with key '{doomed}'")
        assert_names(client.delete("/api/v1/runs/bad key"), 422, ["path", "run_key"], "")


def test_the_big_tables_go_in_chunks(server: LiveServer) -> None:
    with server.client() as client:
        doomed, kept = full_run(client, server.db_url, batches=7), full_run(client, server.db_url)
    doomed_id, kept_id = run_id_of(server.db_url, doomed), run_id_of(server.db_url, kept)
    kept_before = rows_of_run(server.db_url, kept_id)
    chunked = {table.name for table in CHUNKED_TABLES}
    assert {"spans", "steps", "ingested_batches"} == chunked
    before = rows_of_run(server.db_url, doomed_id)
    assert all(before[name] > 3 for name in chunked)  # more than one chunk each
    engine = build_engine(server.db_url)
    factory: sessionmaker[Session] = build_session_factory(engine)
    try:
        chunks = delete_run_rows(factory, doomed_id, chunk_rows=3)
    finally:
        engine.dispose()
    for name in chunked:  # each chunk its own transaction of at most 3 rows; all of them, not the cascade
        assert sum(chunks[name]) == before[name] and max(chunks[name]) == 3, (name, chunks[name])
        assert all(rows <= 3 for rows in chunks[name])
    assert set(rows_of_run(server.db_url, doomed_id).values()) == {0}
    assert rows_of_run(server.db_url, kept_id) == kept_before
