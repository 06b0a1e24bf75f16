"""The schema comes only from the migrations; they match the models; serve guards the revision."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine

from bubblescope.backend.db.models import Base
from tests.support import create_postgres_database, drop_postgres_database, postgres_unreachable_reason


def test_migrated_schema_matches_the_models(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        with engine.connect() as connection:
            differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    finally:
        engine.dispose()
    assert differences == []


@pytest.fixture
def empty_postgres() -> Iterator[str]:
    reason = postgres_unreachable_reason()
    if reason:
        pytest.skip(reason)
    url, name = create_postgres_database()
    yield url
    drop_postgres_database(name)


def test_serve_refuses_an_unmigrated_server_database_and_db_upgrade_fixes_it(empty_postgres: str) -> None:
    serve = [sys.executable, "-m", "bubblescope.cli", "serve", "--db", empty_postgres, "--port", "9"]
    refused = subprocess.run(serve, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert "bubblescope db upgrade" in refused.stderr and "none (empty database)" in refused.stderr
    upgrade = subprocess.run(
        [sys.executable, "-m", "bubblescope.cli", "db", "upgrade", "--db", empty_postgres],
        capture_output=True,
        text=True,
        timeout=60,
    )
    from bubblescope.backend.db.migrate import head_revision

    head = head_revision(empty_postgres)
    assert head != "0001"  # the newest revision, not the first
    assert upgrade.returncode == 0 and f"schema revision {head}" in upgrade.stdout


def test_serve_creates_and_upgrades_an_embedded_sqlite_file(tmp_path) -> None:
    from bubblescope.backend.db.engine import build_engine
    from bubblescope.backend.db.migrate import current_revision, head_revision
    from bubblescope.backend.db.prepare import prepare_database

    url = prepare_database(str(tmp_path / "new" / "b.db"))
    assert current_revision(build_engine(url)) == head_revision(url) != "0001"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def new_database(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'spans.db'}"
    else:
        yield request.getfixturevalue("empty_postgres")


def test_spans_lose_their_id_and_get_it_back_on_a_downgrade_with_every_row_kept(new_database: str) -> None:
    """Migration 0008 drops the spans' surrogate key (PostgreSQL: column and index; SQLite rebuilds the
    table); its downgrade numbers the rows again, and new rows get the next number."""
    from alembic import command
    from sqlalchemy import inspect, text

    from bubblescope.backend.db import migrate

    def insert_span(connection, step: int) -> None:
        connection.execute(
            text(
                "INSERT INTO spans (run_id, rank, step, kind, start_ns, end_ns) VALUES (:run, 0, :s, 'forward', :s, :e)"
            ),
            {"run": run_id, "s": step, "e": step + 1},
        )

    migrate.upgrade(new_database, "0007")
    engine = create_engine(new_database)
    try:
        with engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO runs (key, name, world_size, config, created_at, updated_at) "
                    "VALUES ('r', 'r', 1, '{}', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                )
            )
            run_id = connection.execute(text("SELECT id FROM runs")).scalar_one()
            for step in range(3):
                insert_span(connection, step)
        migrate.upgrade(new_database)
        assert "id" not in {c["name"] for c in inspect(engine).get_columns("spans")}
        with engine.begin() as connection:
            assert connection.execute(text("SELECT count(*) FROM spans")).scalar_one() == 3
            insert_span(connection, 3)
        command.downgrade(migrate.alembic_config(new_database), "0007")
        engine.dispose()
        with engine.begin() as connection:
            ids = connection.execute(text("SELECT id FROM spans ORDER BY step")).scalars().all()
            assert sorted(ids) == [1, 2, 3, 4]
            insert_span(connection, 4)
            assert connection.execute(text("SELECT id FROM spans WHERE step = 4")).scalar_one() == 5
        migrate.upgrade(new_database)
        with engine.begin() as connection:
            assert connection.execute(text("SELECT count(*) FROM spans")).scalar_one() == 5
    finally:
        engine.dispose()
