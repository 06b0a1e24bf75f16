"""Dialect-aware INSERT ... ON CONFLICT for the two databases we support."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import Insert

from bubblescope.backend.db.models import Base


def conflict_insert(
    session: Session, model: type[Base], conflict_columns: Sequence[str], update_columns: Sequence[str] = ()
) -> Insert:
    """INSERT into ``model``'s table that, on a conflict, updates ``update_columns`` or (when none) skips the row.
    Built once per (dialect, table, columns): building costs more than running it on the ingest path."""
    return _conflict_insert(session.get_bind().dialect.name, model, tuple(conflict_columns), tuple(update_columns))


@lru_cache(maxsize=64)
def _conflict_insert(
    dialect: str, model: type[Base], conflict_columns: tuple[str, ...], update_columns: tuple[str, ...]
) -> Insert:
    table = Base.metadata.tables[model.__tablename__]
    insert = postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)
    if update_columns:
        return insert.on_conflict_do_update(
            index_elements=list(conflict_columns),
            set_={column: insert.excluded[column] for column in update_columns},
        )
    return insert.on_conflict_do_nothing(index_elements=list(conflict_columns))


def insert_on_conflict(
    session: Session,
    model: type[Base],
    rows: Sequence[dict[str, Any]],
    conflict_columns: Sequence[str],
    update_columns: Sequence[str] = (),
) -> None:
    if rows:
        # on the connection: a Core statement needs none of the session's ORM execution (a tenth of ingest's time)
        session.connection().execute(conflict_insert(session, model, conflict_columns, update_columns), list(rows))
