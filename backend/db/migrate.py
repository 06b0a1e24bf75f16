"""Run and check the Alembic migrations programmatically (no alembic.ini needed)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

import bubblescope.migrations as migrations_package
from bubblescope.backend.db.engine import ensure_sqlite_directory, normalise_url


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(migrations_package.__file__).parent))
    config.set_main_option("sqlalchemy.url", normalise_url(url).replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    ensure_sqlite_directory(normalise_url(url))
    command.upgrade(alembic_config(url), revision)


def head_revision(url: str) -> str | None:
    return ScriptDirectory.from_config(alembic_config(url)).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


class SchemaOutOfDate(RuntimeError):
    """The database's schema revision is not the code's head revision."""


def require_current(engine: Engine, url: str) -> None:
    current, head = current_revision(engine), head_revision(url)
    if current != head:
        raise SchemaOutOfDate(
            f"database schema is at revision {current or 'none (empty database)'} but this "
            f"version of bubblescope needs {head}; run: bubblescope db upgrade --db '{url}'"
        )
