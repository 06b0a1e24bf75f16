"""Dialect-aware INSERT ... ON CONFLICT for the two databases we support."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session


def insert_on_conflict(
    session: Session,
    table: Table,
    rows: Sequence[dict[str, Any]],
    conflict_columns: Sequence[str],
    update_columns: Sequence[str] = (),
) -> int:
    """Insert rows; on a conflict update ``update_columns`` (or skip when none). Returns rowcount."""
    if not rows:
        return 0
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)
    if update_columns:
        statement = insert.on_conflict_do_update(
            index_elements=list(conflict_columns),
            set_={column: insert.excluded[column] for column in update_columns},
        )
    else:
        statement = insert.on_conflict_do_nothing(index_elements=list(conflict_columns))
    result = session.execute(statement, list(rows)) if len(rows) > 1 else session.execute(statement.values(rows[0]))
    return int(result.rowcount or 0)
