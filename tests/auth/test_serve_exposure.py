"""``serve`` on an address other than loopback: refused without --auth (exit 2, one message saying how
to enable it), started with --insecure or --auth; with --auth and no token, a warning says how to
create one. Each a real ``bubblescope serve`` process on a free port."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from bubblescope.backend.auth.scopes import Scope
from tests.auth.support import make_token
from tests.support import free_port, migrated_database, start_server


def test_a_non_loopback_host_without_auth_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "never-created.db"
    command = [sys.executable, "-m", "bubblescope.cli", "serve", "--host", "0.0.0.0", "--port", str(free_port())]
    done = subprocess.run([*command, "--db", str(db)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    message = done.stderr.strip()
    assert len(message.splitlines()) == 1, message
    for words in ("0.0.0.0", "not a loopback address", "bubblescope token create", "--auth", "--insecure"):
        assert words in message, words
    assert not db.exists()  # refused before anything was opened


def test_insecure_accepts_the_risk(tmp_path: Path) -> None:
    with migrated_database("sqlite", tmp_path) as url:
        live = start_server(url, tmp_path, extra_args=["--host", "0.0.0.0", "--insecure"])
        try:
            assert httpx.get(f"{live.url}/api/v1/runs", timeout=10).status_code == 200  # open, as asked
        finally:
            live.stop()


def test_auth_without_a_token_starts_with_a_warning_saying_how_to_create_one(tmp_path: Path) -> None:
    with migrated_database("sqlite", tmp_path) as url:
        live = start_server(url, tmp_path, extra_args=["--host", "0.0.0.0", "--auth"])
        try:
            assert httpx.get(f"{live.url}/api/v1/runs", timeout=10).status_code == 401
        finally:
            live.stop()
        log = live.log_path.read_text()
        assert "warning: --auth is on and the database holds no API token" in log
        assert f"bubblescope token create --scope admin --name admin --db '{url}'" in log


def test_auth_with_a_token_starts_without_the_warning(tmp_path: Path) -> None:
    with migrated_database("sqlite", tmp_path) as url:
        token = make_token(url, Scope.READ)
        live = start_server(url, tmp_path, extra_args=["--host", "0.0.0.0", "--auth"])
        try:
            answer = httpx.get(f"{live.url}/api/v1/runs", headers={"Authorization": f"Bearer {token}"}, timeout=10)
            assert answer.status_code == 200, answer.text
        finally:
            live.stop()
        assert "warning" not in live.log_path.read_text()
