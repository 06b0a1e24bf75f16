"""Deleting runs: one run by its key (``DELETE /api/v1/runs/{key}``), or those not heard from for a
while (``serve --retain-days``); or only the spans of those (``serve --retain-spans-days``), the
biggest part of a run, keeping its per-step aggregates.

Every row of a run goes: its ranks, steps, spans, ingested batches, capture requests, alerts and
their deliveries. The big tables (spans, steps, ingested batches) are emptied in chunks of
``CHUNK_ROWS`` rows, one transaction each, so a run of a hundred million spans never holds a
transaction (nor, on SQLite, the database's one write lock) for minutes: ingest into other runs goes
on between chunks. Then the run's row is deleted, and the foreign keys' ``ON DELETE CASCADE`` take
the small rest (and whatever was ingested into the run meanwhile). While a deletion is under way
the run is still listed, with fewer rows; a failed deletion (the database gone) leaves a part of
them, and deleting again finishes it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Final, cast

from sqlalchemy import ColumnElement, CursorResult, Table, delete, literal_column, select, tuple_, update
from sqlalchemy.orm import Session, sessionmaker

from bubblescope.backend.db.engine import transaction
from bubblescope.backend.db.models import Base, IngestedBatch, Run, Span, StepAggregate
from bubblescope.backend.errors import NotFound
from bubblescope.backend.store.runs import database_now, find_run

CHUNK_ROWS: Final = 10_000
CHUNKED_TABLES: Final[tuple[Table, ...]] = tuple(
    Base.metadata.tables[model.__tablename__] for model in (Span, StepAggregate, IngestedBatch)
)
log = logging.getLogger("bubblescope.runs")


def delete_run(session_factory: sessionmaker[Session], key: str, chunk_rows: int = CHUNK_ROWS) -> None:
    """Delete the run ``key`` and every row of it; NotFound naming ``run_key`` if there is none."""
    with transaction(session_factory) as session:
        run = find_run(session, key)
        if run is None:
            raise NotFound("run_key", f"no run with key {key!r}")
        run_id = run.id
    delete_run_rows(session_factory, run_id, chunk_rows)
    log.info("bubblescope: deleted run %s", key)


def delete_run_rows(
    session_factory: sessionmaker[Session], run_id: int, chunk_rows: int = CHUNK_ROWS
) -> dict[str, list[int]]:
    """Every row of the run ``run_id``: the big tables chunk by chunk, then the run (cascading the rest).
    The rows each chunk deleted, by table."""
    chunks: dict[str, list[int]] = {}
    for table in CHUNKED_TABLES:
        deleted = chunks.setdefault(table.name, [])
        while not deleted or deleted[-1] == chunk_rows:
            with transaction(session_factory) as session:
                deleted.append(_delete_chunk(session, table, run_id, chunk_rows))
    with transaction(session_factory) as session:
        session.execute(delete(Run).where(Run.id == run_id).execution_options(synchronize_session=False))
    return chunks


def _row_key(session: Session, table: Table) -> list[ColumnElement[Any]]:
    """What names one row of ``table``: its primary key, or for a table without one (spans) the row's
    physical address, which stays put within a statement (PostgreSQL deletes by it with a TID scan)."""
    if table.primary_key.columns:
        return list(table.primary_key.columns)
    return [literal_column("ctid" if session.get_bind().dialect.name == "postgresql" else "rowid")]


def _delete_chunk(session: Session, table: Table, run_id: int, rows: int) -> int:
    key_columns = _row_key(session, table)
    chosen = select(*key_columns).where(table.c.run_id == run_id).limit(rows)
    if len(key_columns) == 1:
        condition = key_columns[0].in_(chosen)
    else:
        condition = tuple_(*key_columns).in_(chosen)
    result = cast(CursorResult[Any], session.execute(delete(table).where(table.c.run_id == run_id, condition)))
    return int(result.rowcount)


def delete_spans_not_heard_since(
    session_factory: sessionmaker[Session], days: float, chunk_rows: int = CHUNK_ROWS
) -> Sequence[str]:
    """Delete the spans of the runs not heard from for more than ``days`` (as ``delete_runs_not_heard_since``
    judges it), chunk by chunk; everything else of them stays. Bumps each run's revision (its cached
    step views go) but not ``updated_at`` (the run was not heard from). The keys of the runs trimmed."""
    spans = Base.metadata.tables[Span.__tablename__]
    with transaction(session_factory) as session:
        cutoff = database_now(session) - timedelta(days=days)
        has_spans = select(Span.run_id).where(Span.run_id == Run.id).exists()
        stale = session.execute(
            select(Run.id, Run.key).where(Run.updated_at < cutoff, has_spans).order_by(Run.id)
        ).all()
    trimmed: list[str] = []
    for run_id, key in stale:
        deleted = [chunk_rows]
        while deleted[-1] == chunk_rows:
            with transaction(session_factory) as session:
                deleted.append(_delete_chunk(session, spans, run_id, chunk_rows))
        with transaction(session_factory) as session:
            session.execute(update(Run).where(Run.id == run_id).values(revision=Run.revision + 1))
        trimmed.append(key)
    if trimmed:
        log.warning(
            "bubblescope: retention deleted the spans of %d run(s) not heard from for %g days", len(trimmed), days
        )
    return trimmed


def delete_runs_not_heard_since(
    session_factory: sessionmaker[Session], days: float, chunk_rows: int = CHUNK_ROWS
) -> Sequence[str]:
    """Delete the runs whose ``updated_at`` (their last registration, ingest or rank end; the
    database's clock) is more than ``days`` old; their keys. A run heard from again before its turn
    comes is kept."""
    with transaction(session_factory) as session:
        cutoff = database_now(session) - timedelta(days=days)
        stale = session.execute(select(Run.id, Run.key).where(Run.updated_at < cutoff).order_by(Run.id)).all()
    deleted: list[str] = []
    for run_id, key in stale:
        with transaction(session_factory) as session:
            still_stale = session.scalars(select(Run.id).where(Run.id == run_id, Run.updated_at < cutoff)).first()
        if still_stale is None:
            continue
        delete_run_rows(session_factory, run_id, chunk_rows)
        deleted.append(key)
    if deleted:
        log.warning("bubblescope: retention deleted %d run(s) not heard from for %g days", len(deleted), days)
    return deleted
