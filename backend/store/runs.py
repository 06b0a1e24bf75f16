"""Runs: find, lock, register, touch, list; the database's clock."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import ColumnElement, and_, func, or_, select, update
from sqlalchemy.orm import Session

from bubblescope.backend.db.models import RankInfo, Run, StepAggregate
from bubblescope.backend.db.upsert import insert_on_conflict
from bubblescope.backend.errors import NotFound


def find_run(session: Session, key: str, for_update: bool = False) -> Run | None:
    query = select(Run).where(Run.key == key)
    if for_update:
        query = query.with_for_update()
    return session.scalars(query).one_or_none()


def require_run(session: Session, key: str) -> Run:
    """The run, or ``NotFound`` naming ``run_key``."""
    run = find_run(session, key)
    if run is None:
        raise NotFound("run_key", f"no run with key {key!r}")
    return run


def lock_run(session: Session, key: str) -> Run | None:
    """The run, locked for writing by this transaction before anything is read (None: unknown).

    A no-op UPDATE first: on PostgreSQL it takes the row's lock; on SQLite it takes the database's
    write lock, which a SELECT ... FOR UPDATE does not (SQLite has none), and doing it before any read
    makes a concurrent transaction wait for the lock instead of reading a snapshot it cannot write from."""
    session.execute(update(Run).where(Run.key == key).values(key=Run.key))
    return find_run(session, key)


def register_run(
    session: Session,
    key: str,
    name: str,
    world_size: int,
    config: dict[str, Any],
    check_config: Callable[[dict[str, Any]], None],
) -> Run:
    """Create the run or merge into it (every rank registers; later config keys win, and the latest
    world size: an elastic job that shrank, or a registration that was wrong, is not stuck with the
    largest ever sent). ``check_config`` sees the merged config before it is written."""
    row = {"key": key, "name": name, "world_size": world_size, "config": config}
    insert_on_conflict(session, Run, [row], ("key",))
    run = find_run(session, key, for_update=True)
    assert run is not None
    merged = {**(run.config or {}), **config}
    check_config(merged)
    session.execute(
        update(Run)
        .where(Run.id == run.id)
        .values(name=name, world_size=world_size, config=merged, updated_at=func.now(), revision=Run.revision + 1)
    )
    session.refresh(run)
    return run


def database_now(session: Session) -> datetime:
    """The database's clock: the one that stamped every ``updated_at``."""
    return session.scalars(select(func.now())).one()


def touch_run(session: Session, run_id: int) -> None:
    session.execute(update(Run).where(Run.id == run_id).values(updated_at=func.now(), revision=Run.revision + 1))


def keys_in_scope(patterns: Sequence[str]) -> ColumnElement[bool]:
    """Runs whose key is one of ``patterns`` or starts with one's prefix (a pattern ending in ``*``), matched
    case-sensitively on every database (SQLite's LIKE ignores case: not used)."""
    matches = [func.substr(Run.key, 1, len(p) - 1) == p[:-1] if p.endswith("*") else Run.key == p for p in patterns]
    return or_(*matches)


LIKE_ESCAPE = "\\"


def _like_escaped(text: str) -> str:
    """``text`` matched literally inside a LIKE pattern (its %, _ and the escape itself escaped)."""
    return "".join(LIKE_ESCAPE + c if c in ("%", "_", LIKE_ESCAPE) else c for c in text)


def _database_time(session: Session, moment: datetime) -> datetime:
    """``moment`` as the database's timestamps compare: in UTC, and naive on SQLite (which stores no zone)."""
    utc = moment.astimezone(timezone.utc) if moment.tzinfo else moment
    bind = session.get_bind()
    return utc.replace(tzinfo=None) if bind.dialect.name == "sqlite" else utc.replace(tzinfo=utc.tzinfo or timezone.utc)


def may_be_in(states: Collection[str], heard_after: datetime) -> ColumnElement[bool] | None:
    """A condition every run in one of ``states`` meets (run_state's rules: necessary, not sufficient:
    the state itself is worked out per run), so the database skips the rest; None: no such shortcut.
    ``heard_after``: the database time before which a run not ended is silent."""
    failed = (
        select(RankInfo.id)
        .where(RankInfo.run_id == Run.id, RankInfo.outcome == "failed", RankInfo.rank < Run.world_size)
        .exists()
    )
    conditions: list[ColumnElement[bool]] = []
    for state in states:
        if state == "finished":
            return None
        conditions.append(
            {
                "failed": failed,
                "running": Run.updated_at >= heard_after,
                "hung": Run.updated_at >= heard_after,
                "silent": Run.updated_at <= heard_after,
            }[state]
        )
    return or_(*conditions) if conditions else None


def list_runs(
    session: Session,
    limit: int,
    after: int | None = None,
    name: str | None = None,
    since: datetime | None = None,
    only: ColumnElement[bool] | None = None,
) -> Sequence[tuple[Run, int]]:
    """Runs with their step counts, most recently active first (then newest id); ``after``: those
    after the run of that id in this order, compared in SQL against its current ``updated_at``, so
    a run that became active again moves the cursor back (runs may repeat, none is skipped).
    ``name``: only runs whose name or key holds it (any case); ``since``: heard from at or after it;
    ``only``: a further condition (``may_be_in``).
    Steps are counted for the listed runs only (a correlated count, not one over every run)."""
    steps = (
        select(func.count(func.distinct(StepAggregate.step)))
        .where(StepAggregate.run_id == Run.id)
        .correlate(Run)
        .scalar_subquery()
    )
    query = select(Run, steps).order_by(Run.updated_at.desc(), Run.id.desc()).limit(limit)
    if name:
        pattern = f"%{_like_escaped(name.lower())}%"
        query = query.where(or_(*(func.lower(c).like(pattern, escape=LIKE_ESCAPE) for c in (Run.name, Run.key))))
    if since is not None:
        query = query.where(Run.updated_at >= _database_time(session, since))
    if only is not None:
        query = query.where(only)
    if after is not None:
        mark = select(Run.updated_at).where(Run.id == after).scalar_subquery()
        query = query.where(or_(Run.updated_at < mark, and_(Run.updated_at == mark, Run.id < after)))
    return [(run, int(count or 0)) for run, count in session.execute(query).all()]


def runs_heard_since(session: Session, since: datetime) -> Sequence[Run]:
    """Runs any rank was heard from after ``since`` (the database's clock)."""
    return session.scalars(select(Run).where(Run.updated_at > since).order_by(Run.id)).all()
