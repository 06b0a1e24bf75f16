"""Dialect-aware INSERT ... ON CONFLICT for the two databases we support."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import Insert


def conflict_insert(
    session: Session, table: Table, conflict_columns: Sequence[str], update_columns: Sequence[str] = ()
) -> Insert:
    """INSERT that, on a conflict, updates ``update_columns`` or (when none) skips the row."""
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)
    if update_columns:
        return insert.on_conflict_do_update(
            index_elements=list(conflict_columns),
            set_={column: insert.excluded[column] for column in update_columns},
        )
    return insert.on_conflict_do_nothing(index_elements=list(conflict_columns))


def insert_on_conflict(
    session: Session,
    table: Table,
    rows: Sequence[dict[str, Any]],
    conflict_columns: Sequence[str],
    update_columns: Sequence[str] = (),
) -> None:
    if rows:
        session.execute(conflict_insert(session, table, conflict_columns, update_columns), list(rows))
