"""Engine and session factory; the one place that knows about database URLs and SQLite pragmas."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker


def normalise_url(url_or_path: str) -> str:
    """Accept a SQLAlchemy URL or a plain file path (taken as an SQLite file)."""
    if "://" in url_or_path:
        url = make_url(url_or_path)
        if url.drivername in ("postgresql", "postgres"):
            url = url.set(drivername="postgresql+psycopg")
        return url.render_as_string(hide_password=False)
    return f"sqlite:///{Path(url_or_path).expanduser().resolve()}"


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def ensure_sqlite_directory(url: str) -> None:
    """SQLite creates the file but not its folder."""
    database = make_url(url).database
    if is_sqlite(url) and database and database != ":memory:":
        Path(database).parent.mkdir(parents=True, exist_ok=True)


def build_engine(url: str) -> Engine:
    url = normalise_url(url)
    if is_sqlite(url):
        ensure_sqlite_directory(url)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    # A database that does not answer fails a request in seconds (503), not after the OS's TCP timeout.
    return create_engine(
        url, pool_pre_ping=True, pool_size=10, max_overflow=20, pool_timeout=10, connect_args={"connect_timeout": 5}
    )


def build_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


AFTER_COMMIT = "bubblescope.after_commit"


def after_commit(session: Session, action: Callable[[Session], None]) -> None:
    """Run ``action`` once the request's transaction has committed, in a short transaction of its own
    (ingest's touch of the run row: taken inside every batch's transaction, it made a 1,024-rank job's
    concurrent batches wait for each other on that one row)."""
    session.info.setdefault(AFTER_COMMIT, []).append(action)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session that commits on success and rolls back on any error: all or nothing. Then what
    ``after_commit`` queued runs in a second, short transaction."""
    session = factory()
    try:
        yield session
        session.commit()
        queued = session.info.pop(AFTER_COMMIT, [])
        for action in queued:
            action(session)
        if queued:
            session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
