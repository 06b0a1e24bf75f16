"""Storing a rank's Flight Recorder dump (read with ``fr_dump.parse_dump``: plain values only) and reading a
run's dumps together (``analysis.flight_recorder_report``)."""

from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from bubblescope import analysis
from bubblescope.backend.db.models import FlightRecorderDump
from bubblescope.backend.errors import Invalid
from bubblescope.backend.flight_recorder.schemas import DumpOut, FlightRecorderOut, GroupOut
from bubblescope.backend.store.runs import require_run, touch_run
from bubblescope.fr_dump import DumpError, as_document, parse_dump


def store_dump(session: Session, run_key: str, data: bytes, file: str, rank: int | None) -> DumpOut:
    """The dump stored as its rank's (replacing an earlier one); a 422 naming the body for a file that is not one."""
    run = require_run(session, run_key)
    try:
        dump = parse_dump(data, file, rank)
    except DumpError as error:
        raise Invalid("body", str(error)) from None
    if dump.rank >= run.world_size:
        raise Invalid("rank", f"rank {dump.rank} is not in run {run_key!r} of {run.world_size} ranks")
    session.execute(
        delete(FlightRecorderDump).where(FlightRecorderDump.run_id == run.id, FlightRecorderDump.rank == dump.rank)
    )
    row = FlightRecorderDump(run_id=run.id, rank=dump.rank, file=file, document=as_document(dump))
    session.add(row)
    touch_run(session, run.id)  # news: the run's page and cached answers move on
    session.flush()
    session.refresh(row)
    return DumpOut(rank=row.rank, file=row.file, uploaded_at=row.uploaded_at)


def report(session: Session, run_key: str) -> FlightRecorderOut:
    """The run's dumps read together; no dump: no group."""
    run = require_run(session, run_key)
    rows = session.scalars(
        select(FlightRecorderDump).where(FlightRecorderDump.run_id == run.id).order_by(FlightRecorderDump.rank)
    ).all()
    dumps = [
        analysis.FrDump(
            rank=row.rank,
            file=row.file,
            version=str(row.document.get("version", "?")),
            pg_config=row.document.get("pg_config") or {},
            pg_status=row.document.get("pg_status") or {},
            entries=row.document.get("entries") or [],
        )
        for row in rows
    ]
    found = analysis.flight_recorder_report(dumps)
    groups = sorted(found.groups, key=lambda group: group.wavefront is None)  # stable: stuck groups first
    return FlightRecorderOut(
        run_key=run_key,
        dumps=[DumpOut(rank=row.rank, file=row.file, uploaded_at=row.uploaded_at) for row in rows],
        groups=[GroupOut.model_validate(group) for group in groups],
    )
