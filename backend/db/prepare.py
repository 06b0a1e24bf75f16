"""Finding the database and making it ready, as ``serve`` and every command that opens it do: ``--db`` a
URL or an SQLite file path, by default $BUBBLESCOPE_DB or else the user data directory's file; an SQLite file is created or
upgraded here, a server database must already be at the current schema (``bubblescope db upgrade``)."""

from __future__ import annotations

import os
from pathlib import Path

from platformdirs import user_data_dir
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from bubblescope.backend.db import migrate
from bubblescope.backend.db.engine import is_sqlite, normalise_url
from bubblescope.backend.errors import first_line

DB_ENV = "BUBBLESCOPE_DB"
"""The database when ``--db`` is not given: a URL with a password belongs here (or in the file named by
``BUBBLESCOPE_DB_PASSWORD_FILE``), not on a command line, which ``ps`` and ``docker inspect`` show."""
DB_PASSWORD_FILE_ENV = "BUBBLESCOPE_DB_PASSWORD_FILE"


def default_db_url() -> str:
    """``$BUBBLESCOPE_DB`` if set, else the user data directory's SQLite file; a password read from the file
    ``$BUBBLESCOPE_DB_PASSWORD_FILE`` (a container secret) goes into the URL."""
    url = normalise_url(os.environ.get(DB_ENV) or str(Path(user_data_dir("bubblescope")) / "bubblescope.db"))
    secret_file = os.environ.get(DB_PASSWORD_FILE_ENV)
    if secret_file and not is_sqlite(url):
        password = Path(secret_file).read_text().strip()
        url = make_url(url).set(password=password).render_as_string(hide_password=False)
    return url


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
