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
    from bubblescope.backend.server import prepare_database

    url = prepare_database(str(tmp_path / "new" / "b.db"))
    assert current_revision(build_engine(url)) == head_revision(url) != "0001"
