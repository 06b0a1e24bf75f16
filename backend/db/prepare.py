"""Finding the database and making it ready, as ``serve`` and every command that opens it do: ``--db`` a
URL or an SQLite file path, by default the user data directory's file; an SQLite file is created or
upgraded here, a server database must already be at the current schema (``bubblescope db upgrade``)."""

from __future__ import annotations

from pathlib import Path

from platformdirs import user_data_dir
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from bubblescope.backend.db import migrate
from bubblescope.backend.db.engine import is_sqlite, normalise_url
from bubblescope.backend.errors import first_line


def default_db_url() -> str:
    return normalise_url(str(Path(user_data_dir("bubblescope")) / "bubblescope.db"))


class DatabaseNotReady(RuntimeError):
    """The database cannot be opened or reached, or its schema is not current: a one-line reason."""


def shown_url(url: str) -> str:
    """The URL without its password, for messages."""
    return make_url(url).render_as_string(hide_password=True)


def prepare_database(db: str | None) -> str:
    """The normalised URL; an SQLite file is created or upgraded here, a server database is not."""
    url = normalise_url(db) if db else default_db_url()
    if is_sqlite(url):
        try:
            migrate.upgrade(url)
        except (DBAPIError, OSError) as error:
            raise DatabaseNotReady(f"cannot open the database {shown_url(url)}: {first_line(error)}") from None
    return url
