"""Queries about runs, ranks, step aggregates and spans."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any, Literal, NamedTuple

from sqlalchemy import ColumnElement, Row, and_, bindparam, case, func, or_, select, text, update
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import ReturningUpdate

from bubblescope.analysis.memory_use import RankMemory
from bubblescope.backend.db.models import Base, RankInfo, Run, Span, StepAggregate
from bubblescope.backend.db.upsert import insert_on_conflict
from bubblescope.backend.runs.state import RankEnd, as_utc, rank_outcome


def find_run(session: Session, key: str, for_update: bool = False) -> Run | None:
    query = select(Run).where(Run.key == key)
    if for_update:
        query = query.with_for_update()
    return session.scalars(query).one_or_none()


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


def register_rank(session: Session, run_id: int, rank: int, values: dict[str, Any]) -> None:
    row = {"run_id": run_id, "rank": rank, **values}
    insert_on_conflict(session, RankInfo, [row], ("run_id", "rank"), tuple(values))


def find_rank(session: Session, run_id: int, rank: int) -> RankInfo | None:
    return session.scalars(select(RankInfo).where(RankInfo.run_id == run_id, RankInfo.rank == rank)).one_or_none()


def end_rank(session: Session, run_id: int, rank: int, values: dict[str, Any]) -> None:
    """Record how the rank ended (a repeat overwrites)."""
    session.execute(
        update(RankInfo).where(RankInfo.run_id == run_id, RankInfo.rank == rank).values(**values, ended_at=func.now())
    )


def rank_ends(session: Session, run_ids: Sequence[int]) -> dict[int, list[RankEnd]]:
    """How every registered rank ended (outcome None: not yet), per run; read as rows, not ORM objects:
    a 16,384-rank run's took 1 s as objects."""
    ends: dict[int, list[RankEnd]] = {run_id: [] for run_id in run_ids}
    if not run_ids:
        return ends
    for row in session.execute(select(RankInfo.run_id, *_END_COLUMNS).where(RankInfo.run_id.in_(run_ids))):
        ends[row.run_id].append(rank_end(row))
    return ends


_END_COLUMNS = (
    RankInfo.rank, RankInfo.outcome, RankInfo.error, RankInfo.end_ns, RankInfo.ended_at, RankInfo.last_heard_at,
    RankInfo.host, RankInfo.stage, RankInfo.last_step, RankInfo.in_flight,
)  # fmt: skip


def rank_end(info: RankInfo | Row[Any]) -> RankEnd:
    """A rank's end from its row or its object (``_END_COLUMNS``)."""
    return RankEnd(
        info.rank,
        rank_outcome(info.outcome),
        info.error,
        info.end_ns,
        ended_at=None if info.ended_at is None else as_utc(info.ended_at),
        last_heard_at=None if info.last_heard_at is None else as_utc(info.last_heard_at),
        host=info.host,
        stage=info.stage,
        last_step=info.last_step,
        in_flight=info.in_flight,
    )


def dropped_spans(session: Session, run_id: int) -> int:
    """Spans the run's collectors dropped, over every rank."""
    return int(session.scalar(select(func.sum(RankInfo.dropped_spans)).where(RankInfo.run_id == run_id)) or 0)


def database_now(session: Session) -> datetime:
    """The database's clock: the one that stamped every ``updated_at``."""
    return session.scalars(select(func.now())).one()


def touch_run(session: Session, run_id: int) -> None:
    session.execute(update(Run).where(Run.id == run_id).values(updated_at=func.now(), revision=Run.revision + 1))


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
            {"failed": failed, "running": Run.updated_at >= heard_after, "silent": Run.updated_at <= heard_after}[state]
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


class RankPlace(NamedTuple):
    """Where a rank runs and its registered clock offset: what reading a step and scoring stragglers need."""

    rank: int
    host: str
    stage: int | None
    coords: dict[str, int]
    clock_offset_ns: int


def rank_places(session: Session, run_id: int) -> list[RankPlace]:
    """The run's ranks in rank order, as rows on the session's connection (16,384 ranks as ORM objects,
    ``ranks_of``: 0.24 s; as rows 0.09-0.12 s)."""
    query = (
        select(RankInfo.rank, RankInfo.host, RankInfo.stage, RankInfo.coords, RankInfo.clock_offset_ns)
        .where(RankInfo.run_id == run_id)
        .order_by(RankInfo.rank)
    )
    return [
        RankPlace(rank, host, stage, coords or {}, offset)
        for rank, host, stage, coords, offset in session.connection().execute(query)
    ]


def ranks_of(session: Session, run_id: int, only: Collection[int] | None = None) -> Sequence[RankInfo]:
    """The run's ranks in rank order (those in ``only``, when given)."""
    query = select(RankInfo).where(RankInfo.run_id == run_id).order_by(RankInfo.rank)
    if only is not None:
        query = query.where(RankInfo.rank.in_(sorted(only)))
    return session.scalars(query).all()


def step_totals(session: Session, run_id: int, first: int | None = None, last: int | None = None) -> Sequence[Row[Any]]:
    """Per step (of ``first``..``last`` when given), summed in the database (a 1,024-rank run of 600
    steps has 600k aggregates): ``step``, ``ranks``, ``first_start`` and ``last_end`` on rank 0's clock,
    and the ``compute``, ``comm``, ``exposed_comm``, ``idle`` and ``windows`` (end - start) sums.

    Each aggregate carries the clock offset in force for its step (ingest fills the rank's where the
    collector sent none), so no join to ``ranks``: on tables whose statistics lag a fresh run,
    PostgreSQL planned that join as a nested loop of ranks x steps (0.8 s at 1,024 ranks, 20 steps)."""
    offset = func.coalesce(StepAggregate.clock_offset_ns, 0)
    query = (
        select(
            StepAggregate.step,
            func.count().label("ranks"),
            func.min(StepAggregate.start_ns - offset).label("first_start"),
            func.max(StepAggregate.end_ns - offset).label("last_end"),
            func.sum(StepAggregate.compute_ns).label("compute"),
            func.sum(StepAggregate.comm_ns).label("comm"),
            func.sum(StepAggregate.idle_ns).label("idle"),
            func.sum(StepAggregate.exposed_comm_ns).label("exposed_comm"),
            func.sum(StepAggregate.end_ns - StepAggregate.start_ns).label("windows"),
        )
        .where(StepAggregate.run_id == run_id)
        .group_by(StepAggregate.step)
        .order_by(StepAggregate.step)
    )
    if first is not None:
        query = query.where(StepAggregate.step >= first)
    if last is not None:
        query = query.where(StepAggregate.step <= last)
    rows: Sequence[Row[Any]] = session.execute(query).all()  # type: ignore[assignment]  # Row's column types
    return rows


def memory_peaks(session: Session, run_id: int, steps: Collection[int]) -> list[RankMemory]:
    """Each rank's highest per-step memory peaks over ``steps`` (retries summed), with its stage and
    registered limit; ranks that sent no readings are left out."""
    columns = StepAggregate
    peaks = (
        select(
            StepAggregate.rank,
            func.max(columns.peak_rss_bytes).label("peak_rss_bytes"),
            func.max(columns.gpu_peak_allocated_bytes).label("gpu_peak_allocated_bytes"),
            func.max(columns.gpu_peak_reserved_bytes).label("gpu_peak_reserved_bytes"),
            func.sum(columns.gpu_alloc_retries).label("gpu_alloc_retries"),
        )
        .where(StepAggregate.run_id == run_id, StepAggregate.step.in_(sorted(steps)))
        .where((columns.peak_rss_bytes.is_not(None)) | (columns.gpu_peak_reserved_bytes.is_not(None)))
        .group_by(StepAggregate.rank)
        .subquery()
    )
    query = (
        select(peaks, RankInfo.stage, RankInfo.memory_limit_bytes)
        .outerjoin(RankInfo, (RankInfo.run_id == run_id) & (RankInfo.rank == peaks.c.rank))
        .order_by(peaks.c.rank)
    )
    return [
        RankMemory(
            rank=row.rank,
            stage=row.stage,
            peak_rss_bytes=row.peak_rss_bytes,
            gpu_peak_allocated_bytes=row.gpu_peak_allocated_bytes,
            gpu_peak_reserved_bytes=row.gpu_peak_reserved_bytes,
            gpu_alloc_retries=None if row.gpu_alloc_retries is None else int(row.gpu_alloc_retries),
            limit_bytes=row.memory_limit_bytes,
        )
        for row in session.execute(query)
    ]


def stage_sizes(session: Session, run_id: int) -> dict[int, tuple[int, int | None]]:
    """(layers, parameters) of each stage the ranks counted and registered (``stage_layers``)."""
    query = select(RankInfo.stages, RankInfo.stage_layers, RankInfo.stage_params).where(
        RankInfo.run_id == run_id, RankInfo.stage_layers.is_not(None)
    )
    sizes: dict[int, tuple[int, int | None]] = {}
    for stages, layers, params in session.execute(query):
        layers = layers or []
        for at, stage in enumerate(stages or []):
            if at < len(layers):
                sizes[stage] = (layers[at], params[at] if params and at < len(params) else None)
    return sizes


def step_aggregates(session: Session, run_id: int, step: int | None = None) -> Sequence[StepAggregate]:
    query = select(StepAggregate).where(StepAggregate.run_id == run_id)
    if step is not None:
        query = query.where(StepAggregate.step == step)
    return session.scalars(query.order_by(StepAggregate.step, StepAggregate.rank)).all()


def first_step(session: Session, run_id: int) -> int | None:
    """The lowest step any rank of the run reported (None: none yet); the warm-up counts from it."""
    return session.scalar(select(func.min(StepAggregate.step)).where(StepAggregate.run_id == run_id))


def newest_step(session: Session, run_id: int) -> int | None:
    """The highest step any rank of the run reported (None: none yet)."""
    return session.scalar(select(func.max(StepAggregate.step)).where(StepAggregate.run_id == run_id))


# One index probe per distinct step (a "loose index scan" on ix_spans_run_step), not a scan of every
# span: a 1,024-rank run holds ~100k spans per sampled step, and PostgreSQL has no skip scan of its own.
_STEPS_WITH_SPANS = text(
    """
    WITH RECURSIVE found(step) AS (
        SELECT min(step) FROM spans WHERE run_id = :run_id
        UNION ALL
        SELECT (SELECT min(step) FROM spans WHERE run_id = :run_id AND step > found.step)
        FROM found WHERE found.step IS NOT NULL
    )
    SELECT step FROM found WHERE step IS NOT NULL
    """
)


def steps_with_spans(session: Session, run_id: int) -> set[int]:
    return {int(step) for step in session.scalars(_STEPS_WITH_SPANS, {"run_id": run_id})}


SPAN_COLUMNS = (
    Span.rank,
    Span.kind,
    Span.start_ns,
    Span.end_ns,
    Span.stage,
    Span.microbatch,
    Span.peer,
    Span.bytes,
    Span.group,
    Span.name,
)  # fmt: skip  (runs.step_spans.aligned_spans unpacks rows in this order)


def spans_of_step(session: Session, run_id: int, step: int, ranks: Collection[int] | None = None) -> Sequence[Row[Any]]:
    """The step's spans (of ``ranks`` only, when given) as plain rows (attribute access as on ``Span``): a
    1,024-rank step holds ~100k, and rows cost a fraction of ORM objects to load."""
    query = select(*SPAN_COLUMNS).where(Span.run_id == run_id, Span.step == step).order_by(Span.rank, Span.start_ns)
    if ranks is not None:
        query = query.where(Span.rank.in_(sorted(ranks)))
    rows: Sequence[Row[Any]] = session.execute(query).all()  # type: ignore[assignment]  # Row's column types
    return rows


def runs_heard_since(session: Session, since: datetime) -> Sequence[Run]:
    """Runs any rank was heard from after ``since`` (the database's clock)."""
    return session.scalars(select(Run).where(Run.updated_at > since).order_by(Run.id)).all()


def ranks_reporting(session: Session, run_id: int, first: int) -> int:
    """How many ranks reported a step from ``first`` on."""
    query = select(func.count(func.distinct(StepAggregate.rank))).where(
        StepAggregate.run_id == run_id, StepAggregate.step >= first
    )
    return int(session.scalar(query) or 0)


def record_contact(
    session: Session,
    run_id: int,
    rank: int,
    last_step: int | None,
    in_flight: dict[str, Any] | Literal[False] | None,
) -> int | None:
    """The rank was heard from now: its newest step and its op in flight (False: leave it as is).
    Returns the rank's registered clock offset (None: the rank has not registered).

    The durations in ``in_flight`` are as of ``last_heard_at`` (the watchdog's reports are what
    keeps a stalled rank heard from), so a reader adds the time since."""
    params: dict[str, Any] = {"p_run_id": run_id, "p_rank": rank, "p_last_step": last_step, "p_in_flight": in_flight}
    found = session.connection().execute(_contact_update(last_step is not None, in_flight is not False), params)
    return found.scalar_one_or_none()


def fill_step_offsets(session: Session, run_id: int, rank: int, offset: int) -> None:
    """Give the rank's aggregates that arrived before it registered its clock offset."""
    steps = StepAggregate.__table__.c
    session.execute(
        update(Base.metadata.tables[StepAggregate.__tablename__])
        .where(steps.run_id == run_id, steps.rank == rank, steps.clock_offset_ns.is_(None))
        .values(clock_offset_ns=offset)
    )


@lru_cache(maxsize=4)
def _contact_update(has_step: bool, sets_in_flight: bool) -> ReturningUpdate[int]:
    """record_contact's UPDATE, built once per shape (building it cost more than running it, per batch)."""
    ranks = RankInfo.__table__.c
    values: dict[str, Any] = {"last_heard_at": func.now()}
    if has_step:
        step = bindparam("p_last_step", type_=ranks.last_step.type)
        values["last_step"] = case((ranks.last_step.is_(None) | (ranks.last_step < step), step), else_=ranks.last_step)
        values["last_step_at"] = func.now()
    if sets_in_flight:
        values["in_flight"] = bindparam("p_in_flight", type_=ranks.in_flight.type)
    where = (ranks.run_id == bindparam("p_run_id")) & (ranks.rank == bindparam("p_rank"))
    table = Base.metadata.tables[RankInfo.__tablename__]
    return update(table).where(where).values(values).returning(ranks.clock_offset_ns)
