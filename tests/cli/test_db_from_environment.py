"""The database from the environment (``BUBBLESCOPE_DB``, ``BUBBLESCOPE_DB_PASSWORD_FILE``): a URL with a password
never needs to be on a command line, and ``serve`` never prints the password."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from bubblescope.backend.db import migrate
from bubblescope.backend.db.prepare import default_db_url
from tests.support import (
    create_postgres_database,
    drop_postgres_database,
    free_port,
    postgres_unreachable_reason,
    wait_until,
)


def test_the_password_file_goes_into_the_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "db_password"
    secret.write_text("s3cret-pass\n")
    monkeypatch.setenv("BUBBLESCOPE_DB", "postgresql+psycopg://bubblescope@db:5432/bubblescope")
    monkeypatch.setenv("BUBBLESCOPE_DB_PASSWORD_FILE", str(secret))
    assert default_db_url() == "postgresql+psycopg://bubblescope:s3cret-pass@db:5432/bubblescope"


@pytest.mark.postgres
def test_serve_takes_the_url_from_the_environment_and_never_prints_its_password(tmp_path: Path) -> None:
    reason = postgres_unreachable_reason()
    if reason:
        pytest.skip(reason)
    url, name = create_postgres_database()
    migrate.upgrade(url)
    with_password = url.replace("postgres@", "postgres:s3cret-pass@", 1)  # trust auth: any password is let in
    assert "s3cret-pass" in with_password
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as handle:
        server = subprocess.Popen(
            [sys.executable, "-m", "bubblescope.cli", "serve", "--port", str(port)],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env={**os.environ, "BUBBLESCOPE_DB": with_password},
        )
    try:

        def ready() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/api/v1/ready", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(ready, 60, "serve on the environment's database", interval_s=0.2)
        printed = log.read_text()
        assert name in printed and "***" in printed and "s3cret-pass" not in printed, printed
    finally:
        server.terminate()
        server.wait(30)
        drop_postgres_database(name)
