"""``bubblescope token create|list|revoke``, and ``serve``'s checks of its exposure and its tokens.

The database is found as ``serve`` finds it (``db.prepare.prepare_database``): ``--db`` a URL or an SQLite
file, by default the user data directory's; an SQLite file is created or upgraded, a server database
must be at the current schema (``bubblescope db upgrade``). Exit status: 0 done, 1 no such token to
revoke, 2 a refused request (a bad name, scope or token text, an unreachable database)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime

from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from bubblescope.backend.auth import service
from bubblescope.backend.auth.tokens import new_token_text, token_text_problem
from bubblescope.backend.db import migrate
from bubblescope.backend.db.engine import build_engine, build_session_factory, transaction
from bubblescope.backend.db.models import ApiToken
from bubblescope.backend.db.prepare import DatabaseNotReady, prepare_database
from bubblescope.backend.errors import DomainError, NotFound, first_line
from bubblescope.backend.settings import ServiceSettings, is_loopback


class CommandFailed(Exception):
    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


def token_command(args: argparse.Namespace) -> int:
    """``bubblescope token ...``: one of create, list, revoke."""
    handlers = {"create": _create, "list": _list, "revoke": _revoke}
    try:
        with _database(args.db) as session:
            handlers[args.token_command](session, args)
    except CommandFailed as error:
        print(f"bubblescope token {args.token_command}: {error}", file=sys.stderr)
        return error.status
    return 0


@contextmanager
def _database(db: str | None) -> Iterator[Session]:
    try:
        url = prepare_database(db)
        engine = build_engine(url)
        migrate.require_current(engine, url)
    except (DatabaseNotReady, migrate.SchemaOutOfDate) as error:
        raise CommandFailed(str(error)) from None
    except DBAPIError as error:
        raise CommandFailed(f"cannot reach the database: {first_line(error)}") from None
    try:
        with transaction(build_session_factory(engine)) as session:
            yield session
    except DomainError as error:
        raise CommandFailed(f"{error.field[0]}: {error.message}", 1 if isinstance(error, NotFound) else 2) from None
    finally:
        engine.dispose()


def _create(session: Session, args: argparse.Namespace) -> None:
    if args.value_env is None:
        text = new_token_text()
    else:
        text = os.environ.get(args.value_env, "")
        if not text:
            raise CommandFailed(f"--value-env: the environment variable {args.value_env} is not set, or empty")
        problem = token_text_problem(text)
        if problem:
            raise CommandFailed(f"--value-env: the token in {args.value_env} {problem}")
    runs = None if args.runs is None else [part.strip() for part in args.runs.split(",")]
    created = service.create_token(session, args.name, args.scope, text, runs)
    row = created.row
    if not created.created:
        print(f"token {row.name!r} (scope {row.scope}, prefix {row.prefix}) exists already: nothing changed")
        return
    what = f"scope {row.scope} for {'every run' if row.runs is None else 'the runs ' + _runs_shown(row)}"
    if args.value_env is None:
        print(text)  # the only time it is shown: stdout holds the token alone, for scripts
        print(f"created token {row.name!r} with {what}; it is shown only this once", file=sys.stderr)
    else:
        print(f"created token {row.name!r} with {what} (prefix {row.prefix}) from {args.value_env}")


def _runs_shown(token: ApiToken) -> str:
    """The runs a token is bound to as ``--runs`` takes them; ``all`` for an unbound token."""
    return "all" if token.runs is None else ",".join(token.runs)


LIST_COLUMNS = ("name", "scope", "runs", "prefix", "created", "last used", "revoked")


def _list(session: Session, _args: argparse.Namespace) -> None:
    rows = [LIST_COLUMNS, *(_listed(token) for token in service.list_tokens(session))]
    for line in _aligned(rows):
        print(line)


def _listed(token: ApiToken) -> tuple[str, ...]:
    when = (_when(token.created_at), _when(token.last_used_at), _when(token.revoked_at))
    return (token.name, token.scope, _runs_shown(token), token.prefix, *when)


def _when(moment: datetime | None) -> str:
    return "-" if moment is None else moment.strftime("%Y-%m-%d %H:%M")


def _aligned(rows: Sequence[tuple[str, ...]]) -> Iterator[str]:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        yield "  ".join(value.ljust(width) for value, width in zip(row, widths)).rstrip()


def _revoke(session: Session, args: argparse.Namespace) -> None:
    token = service.revoke_token(session, args.name_or_prefix)
    print(f"revoked token {token.name!r} (scope {token.scope}, prefix {token.prefix}); refused within seconds")


def exposure_refusal(host: str, settings: ServiceSettings) -> str | None:
    """Why ``serve`` must not start on ``host``: a non-loopback address without ``--auth`` (nor
    ``--insecure``) would let anyone who reaches it write and delete runs. None: it may."""
    if is_loopback(host) or settings.auth or settings.insecure:
        return None
    return (
        f"refusing to serve on {host}, which is not a loopback address, without --auth: anyone who reaches it "
        "could write, read and delete runs. To enable auth, create a token with "
        "`bubblescope token create --scope admin --name NAME` (and `--scope ingest` for collectors, "
        "`--scope read` for people), then pass --auth; or pass --insecure to accept the risk"
    )


def missing_token_warning(url: str, db_argument: str | None) -> str | None:
    """With ``--auth``: a warning when the database holds no token that is not revoked (every request
    but health would be refused), saying how to create one. None when there is one."""
    engine = build_engine(url)
    try:
        with transaction(build_session_factory(engine)) as session:
            if service.has_active_tokens(session):
                return None
    finally:
        engine.dispose()
    db = f" --db '{_hide_password(db_argument)}'" if db_argument else ""
    return (
        "warning: --auth is on and the database holds no API token, so every request but health is refused; "
        f"create one with: bubblescope token create --scope admin --name admin{db}"
    )


def _hide_password(db: str) -> str:
    return make_url(db).render_as_string(hide_password=True) if "://" in db else db
