"""``bubblescope token create|list|revoke`` as a person and docker-compose run them: the token shown
once and stored only as its SHA-256, ``--value-env`` idempotent, revocation by name or prefix."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from bubblescope.cli import main
from tests.support import migrated_database


def token_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The ``bubblescope`` executable, as a person runs it."""
    command = [sys.executable, "-m", "bubblescope.cli", "token", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})


@dataclass(frozen=True)
class Done:
    returncode: int
    stdout: str
    stderr: str


TokenCli = Callable[..., Done]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> TokenCli:
    """``bubblescope token ...`` through the command's own ``main``, in this process (a subprocess per
    call would spend seconds importing); ``env`` sets environment variables for the call."""

    def run(*args: str, env: dict[str, str] | None = None) -> Done:
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        capsys.readouterr()
        status = main(["token", *args])
        out, err = capsys.readouterr()
        return Done(status, out, err)

    return run


def stored_tokens(db_url: str) -> list[tuple[str, str, str, str, bool]]:
    """(name, scope, token_hash, prefix, revoked) of every row, read straight from the database."""
    engine = create_engine(db_url)
    try:
        with engine.connect() as connection:
            query = "SELECT name, scope, token_hash, prefix, revoked_at IS NOT NULL FROM api_tokens ORDER BY id"
            return [(a, b, c, d, bool(e)) for a, b, c, d, e in connection.execute(text(query)).all()]
    finally:
        engine.dispose()


@pytest.fixture
def db(tmp_path: Path) -> str:
    """A database path that does not exist yet: the command creates and migrates it, as serve does."""
    return f"sqlite:///{tmp_path / 'tokens.db'}"


def test_create_prints_the_token_once_and_stores_its_sha256(db: str) -> None:
    created = token_cli("create", "--scope", "read", "--name", "alice", "--db", db)
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    assert created.stdout.count("\n") == 1 and token.startswith("bs_") and len(token) >= 40
    assert "shown only this once" in created.stderr
    [(name, scope, digest, prefix, revoked)] = stored_tokens(db)
    assert (name, scope, revoked) == ("alice", "read", False)
    assert digest == hashlib.sha256(token.encode()).hexdigest() and prefix == token[:10]

    listed = token_cli("list", "--db", db)
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split() == ["name", "scope", "runs", "prefix", "created", "last", "used", "revoked"]
    assert row.split()[:4] == ["alice", "read", "all", prefix] and row.split()[-2:] == [
        "-",
        "-",
    ]  # never used, not revoked
    assert token not in listed.stdout and digest not in listed.stdout


def test_value_env_is_idempotent_and_refuses_what_would_change(cli: TokenCli, db: str) -> None:
    env = {"BS_INGEST_TOKEN": "compose-ingest-token-0123456789abcdefghij"}
    first = cli(
        "create", "--scope", "ingest", "--name", "collectors", "--value-env", "BS_INGEST_TOKEN", "--db", db, env=env
    )
    assert first.returncode == 0, first.stderr
    assert env["BS_INGEST_TOKEN"] not in first.stdout + first.stderr  # the operator knows it; not echoed
    again = cli(
        "create", "--scope", "ingest", "--name", "collectors", "--value-env", "BS_INGEST_TOKEN", "--db", db, env=env
    )
    assert again.returncode == 0, again.stderr
    assert "nothing changed" in again.stdout
    assert len(stored_tokens(db)) == 1

    other_scope = cli(
        "create", "--scope", "admin", "--name", "collectors", "--value-env", "BS_INGEST_TOKEN", "--db", db, env=env
    )
    assert other_scope.returncode == 2 and "scope" in other_scope.stderr and "'ingest'" in other_scope.stderr

    assert cli("revoke", "collectors", "--db", db).returncode == 0
    after_revoke = cli(
        "create", "--scope", "ingest", "--name", "collectors", "--value-env", "BS_INGEST_TOKEN", "--db", db, env=env
    )
    assert after_revoke.returncode == 2 and "revoked" in after_revoke.stderr
    assert len(stored_tokens(db)) == 1


@pytest.mark.parametrize(
    ("value", "words"),
    [("", "not set"), ("short-token", "characters"), ("a token with spaces in it, long enough to pass", "printable")],
    ids=["empty", "short", "spaces"],
)
def test_value_env_refuses_a_value_that_cannot_be_a_token(cli: TokenCli, db: str, value: str, words: str) -> None:
    done = cli("create", "--scope", "read", "--name", "x", "--value-env", "BS_T", "--db", db, env={"BS_T": value})
    assert done.returncode == 2, done.stdout
    assert "--value-env" in done.stderr and words in done.stderr


def test_a_name_is_checked_and_held_by_one_token_until_revoked(cli: TokenCli, db: str) -> None:
    bad = cli("create", "--scope", "read", "--name", "no spaces please", "--db", db)
    assert bad.returncode == 2 and "name" in bad.stderr
    assert cli("create", "--scope", "read", "--name", "bob", "--db", db).returncode == 0
    taken = cli("create", "--scope", "admin", "--name", "bob", "--db", db)
    assert taken.returncode == 2 and "named 'bob' exists" in taken.stderr
    assert cli("revoke", "bob", "--db", db).returncode == 0
    assert cli("create", "--scope", "admin", "--name", "bob", "--db", db).returncode == 0


def test_revoke_by_name_or_prefix(cli: TokenCli, db: str) -> None:
    created = cli("create", "--scope", "admin", "--name", "carol", "--db", db)
    prefix = created.stdout.strip()[:10]
    revoked = cli("revoke", prefix, "--db", db)
    assert revoked.returncode == 0, revoked.stderr
    assert "carol" in revoked.stdout
    assert stored_tokens(db)[0][4] is True
    listed = cli("list", "--db", db).stdout.splitlines()[1]
    assert listed.split()[-1] != "-"  # the revocation time
    again = cli("revoke", "carol", "--db", db)
    assert again.returncode == 1 and "revoked already" in again.stderr
    unknown = cli("revoke", "nobody", "--db", db)
    assert unknown.returncode == 1 and "'nobody'" in unknown.stderr


def test_revoke_refuses_a_prefix_two_tokens_share(cli: TokenCli, db: str) -> None:
    env = {"T1": "shared-prefix-token-one-0123456789abcdef", "T2": "shared-prefix-token-two-0123456789abcdef"}
    for name, var in (("one", "T1"), ("two", "T2")):
        assert cli("create", "--scope", "read", "--name", name, "--value-env", var, "--db", db, env=env).returncode == 0
    ambiguous = cli("revoke", "shared-pre", "--db", db)
    assert ambiguous.returncode == 2 and "matches 2 tokens" in ambiguous.stderr
    assert [row[4] for row in stored_tokens(db)] == [False, False]


def test_the_default_database_is_serves(tmp_path: Path) -> None:
    """Without --db the command uses the user data directory's database, as ``serve`` does."""
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "HOME": str(tmp_path)}
    created = token_cli("create", "--scope", "read", "--name", "dflt", env=env)
    assert created.returncode == 0, created.stderr
    probe = subprocess.run(
        [sys.executable, "-c", "from bubblescope.backend.db.prepare import default_db_url; print(default_db_url())"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=True,
    )
    assert [row[0] for row in stored_tokens(probe.stdout.strip())] == ["dflt"]


@pytest.fixture
def postgres_db(tmp_path: Path) -> Iterator[str]:
    with migrated_database("postgres", tmp_path) as url:
        yield url


@pytest.mark.postgres
def test_the_commands_on_postgresql(cli: TokenCli, postgres_db: str) -> None:
    created = cli("create", "--scope", "ingest", "--name", "pg", "--db", postgres_db)
    assert created.returncode == 0, created.stderr
    assert "pg" in cli("list", "--db", postgres_db).stdout
    assert cli("revoke", "pg", "--db", postgres_db).returncode == 0
    assert stored_tokens(postgres_db)[0][4] is True


def test_a_token_bound_to_runs_is_listed_with_them_and_kept_so(cli: TokenCli, db: str) -> None:
    """``--runs`` binds a token to run keys or prefixes (docs/access.md); ``--value-env`` again with other runs is
    refused (revoke to change them), and an admin token is never bound."""
    env = {"BS_TEAM_A": "team-a-ingest-token-0123456789abcdefghij"}
    args = ("create", "--scope", "ingest", "--name", "team-a", "--value-env", "BS_TEAM_A", "--db", db)
    first = cli(*args, "--runs", "team-a-*, nightly", env=env)
    assert first.returncode == 0, first.stderr
    assert "for the runs team-a-*,nightly" in first.stdout
    row = cli("list", "--db", db).stdout.splitlines()[1].split()
    assert row[:3] == ["team-a", "ingest", "team-a-*,nightly"]
    other = cli(*args, "--runs", "team-b-*", env=env)
    assert (
        other.returncode == 2
        and "runs: this token is stored as 'team-a' for runs 'team-a-*', 'nightly'" in other.stderr
    )
    unbound = cli(*args, env=env)
    assert unbound.returncode == 2 and "runs:" in unbound.stderr
    admin = cli("create", "--scope", "admin", "--name", "root", "--runs", "x-*", "--db", db)
    assert admin.returncode == 2 and "runs: an admin token is not bound to runs" in admin.stderr
    bad = cli("create", "--scope", "read", "--name", "r", "--runs", "a b", "--db", db)
    assert bad.returncode == 2 and "'a b' is neither a run key nor a key prefix" in bad.stderr
