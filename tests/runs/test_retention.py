"""``serve --retain-days D``: runs not heard from for D days are deleted (every row of them), the
others kept; ``--retain-spans-days S``: only the spans of runs not heard from for S days go, the rest of
them stays readable. A run is made old by setting its ``updated_at`` in the database."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import create_engine, update

from bubblescope.backend.db.engine import build_engine, build_session_factory
from bubblescope.backend.db.models import Run
from bubblescope.backend.runs.deletion import delete_runs_not_heard_since, delete_spans_not_heard_since
from tests.runs.run_rows import full_run, rows_of_run, run_id_of
from tests.support import LiveServer, migrated_database, start_server, wait_until


def last_heard_days_ago(db_url: str, key: str, days: float) -> None:
    engine = create_engine(db_url)
    try:
        with engine.begin() as connection:
            then = datetime.now(timezone.utc) - timedelta(days=days)
            connection.execute(update(Run).where(Run.key == key).values(updated_at=then))
    finally:
        engine.dispose()


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], ids=lambda p: p
)
def open_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A service on a database of this module's own: retention looks at every run in it."""
    with migrated_database(request.param, tmp_path_factory.mktemp("retention-db")) as url:
        live = start_server(url, tmp_path_factory.mktemp("retention-server"))
        yield live
        live.stop()


def test_only_runs_older_than_the_retention_are_deleted(open_server: LiveServer) -> None:
    url = open_server.db_url
    with open_server.client() as client:
        old, recent, fresh = (full_run(client, url) for _ in range(3))
    last_heard_days_ago(url, old, 30)
    last_heard_days_ago(url, recent, 6)
    ids = {key: run_id_of(url, key) for key in (old, recent, fresh)}
    kept_before = {key: rows_of_run(url, ids[key]) for key in (recent, fresh)}

    engine = build_engine(url)
    try:
        deleted = delete_runs_not_heard_since(build_session_factory(engine), 7)
    finally:
        engine.dispose()
    assert list(deleted) == [old]
    assert set(rows_of_run(url, ids[old]).values()) == {0}
    assert {key: rows_of_run(url, ids[key]) for key in (recent, fresh)} == kept_before


def test_span_retention_keeps_the_rest_of_the_run_readable(open_server: LiveServer) -> None:
    url = open_server.db_url
    with open_server.client() as client:
        old, fresh = (full_run(client, url) for _ in range(2))
        step_tag = client.get(f"/api/v1/runs/{old}/steps/1").headers["etag"]
    last_heard_days_ago(url, old, 30)
    ids = {key: run_id_of(url, key) for key in (old, fresh)}
    before = {key: rows_of_run(url, ids[key]) for key in (old, fresh)}
    with open_server.client() as client:
        heard = client.get(f"/api/v1/runs/{old}").json()["updated_at"]
    engine = build_engine(url)
    try:
        trimmed = delete_spans_not_heard_since(build_session_factory(engine), 7, chunk_rows=3)
    finally:
        engine.dispose()
    assert list(trimmed) == [old]
    after = rows_of_run(url, ids[old])
    assert after["spans"] == 0 and before[old]["spans"] > 0
    assert {t: n for t, n in after.items() if t != "spans"} == {t: n for t, n in before[old].items() if t != "spans"}
    assert rows_of_run(url, ids[fresh]) == before[fresh]
    with open_server.client() as client:
        run = client.get(f"/api/v1/runs/{old}").json()
        assert len(run["steps"]) == 4 and not any(step["has_spans"] for step in run["steps"])
        assert run["updated_at"] == heard  # the trim is not news from the run
        stale = client.get(f"/api/v1/runs/{old}/steps/1", headers={"If-None-Match": step_tag})
        assert stale.status_code == 200 and stale.json()["spans"] == []  # the stored answer went with the revision
        assert client.get(f"/api/v1/runs/{old}/stragglers").status_code == 200


def test_serve_retain_days_deletes_old_runs(tmp_path: Path) -> None:
    """The hourly task's first round runs when the service starts."""
    with migrated_database("sqlite", tmp_path) as url:
        first = start_server(url, tmp_path)
        try:
            with first.client() as client:
                old, fresh = full_run(client, url), full_run(client, url)
        finally:
            first.stop()
        last_heard_days_ago(url, old, 3)
        old_id, fresh_id = run_id_of(url, old), run_id_of(url, fresh)
        fresh_rows = rows_of_run(url, fresh_id)

        retaining = start_server(url, tmp_path, extra_args=["--retain-days", "2"])
        try:
            wait_until(lambda: rows_of_run(url, old_id)["runs"] == 0, timeout_s=30, what="the old run's deletion")
            assert set(rows_of_run(url, old_id).values()) == {0}
            assert rows_of_run(url, fresh_id) == fresh_rows
            with retaining.client() as client:
                assert client.get(f"/api/v1/runs/{fresh}").status_code == 200
        finally:
            retaining.stop()
