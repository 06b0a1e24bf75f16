"""The alert delivery tests' database: one per module (an Alertmanager push carries every firing
alert in the database, so other modules' alerts stay out), SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import migrated_database


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], ids=lambda p: p
)
def alerts_db(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with migrated_database(request.param, tmp_path_factory.mktemp("alerts-db")) as url:
        yield url
