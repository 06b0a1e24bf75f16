"""Profiles' traces at the service: ``POST /api/v1/runs/{run_key}/profiles/{profile_id}?rank=R`` takes one rank's
torch.profiler trace of a profile request (``POST /runs/{key}/profile``), as its collector uploads it;
``GET /api/v1/runs/{run_key}/profiles`` lists the run's profiles and the traces received, for its page.

A profile's traces are imported (``trace_upload``: the same gate, size and time limits) as a run of their own,
``profile_run_key``, linked to the request in ``profile_traces``, so they open, compare and export like any run.
Bounded: only the request's ``upload_ranks`` (at most ``MAX_PROFILE_UPLOADS``; every rank profiles, the others keep
their traces on their own disks) are taken, and the number of requests is the capture limit's
(``--captures-per-hour``). A trace must hold the profiled steps and the rank it is sent as; a rank sent twice (a
collector retrying after a lost answer) is answered with the first. ``?check=true`` with no body asks first: 200 with
the trace already stored, 204 when the service waits for it, 404 or 422 as the upload would be answered, 413 when
``bytes`` (the trace's size) is past ``--max-trace-bytes``. A
collector asks before streaming a file, since an answer given before a large body is read reaches the sender as a
reset connection, not as the answer.

At the top of the service's layers, beside ``trace_upload``, which it reuses.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Path as PathParam, Query, Request, Response
from pydantic import BaseModel
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from bubblescope import wire
from bubblescope.backend.db.engine import transaction
from bubblescope.backend.db.models import CaptureRequest, ProfileTrace, Run
from bubblescope.backend.db.session import DbSession
from bubblescope.backend.db.timestamps import as_utc
from bubblescope.backend.errors import Conflict, Invalid, NotFound, TooLarge
from bubblescope.backend.fields import INT64_MAX, RunKey
from bubblescope.backend.settings import settings_of
from bubblescope.backend.store.runs import find_run, require_run, touch_run
from bubblescope.backend.trace_upload import TRACE_BODY, converted, file_name, received_trace, store_imported
from bubblescope.trace_import import ImportedRank

router = APIRouter(prefix=f"{wire.API_PREFIX}/runs", tags=["capture"])

MAX_KEY = 128
PROFILES_LISTED = 20  # newest first; a run asks for at most --captures-per-hour an hour


class ProfileTraceOut(BaseModel):
    rank: int
    file: str
    bytes: int
    uploaded_at: datetime


class ProfileTraceStored(ProfileTraceOut):
    profile_id: int
    run_key: str  # the run the trace was imported as
    steps: list[int]


class ProfileOut(BaseModel):
    id: int
    from_step: int
    steps: int
    asked_at: datetime
    upload_ranks: list[int]
    run_key: str  # the run its traces are imported as (it exists once the first arrived)
    traces: list[ProfileTraceOut]


class ProfilesOut(BaseModel):
    run_key: str
    total: int  # profiles the run has; the newest PROFILES_LISTED are listed
    profiles: list[ProfileOut]


def profile_run_key(run_key: str, profile_id: int) -> str:
    """``<run key>:profile-<id>``; a key too long for that keeps its start and a digest of the whole (the id is
    unique across runs, the digest keeps two long keys with one start apart)."""
    suffix = f":profile-{profile_id}"
    if len(run_key) + len(suffix) <= MAX_KEY:
        return run_key + suffix
    digest = hashlib.sha256(run_key.encode()).hexdigest()[:12]
    return f"{run_key[: MAX_KEY - len(suffix) - len(digest) - 1]}-{digest}{suffix}"


@router.post(
    "/{run_key}/profiles/{profile_id}",
    response_model=ProfileTraceStored,
    status_code=201,
    openapi_extra=TRACE_BODY,
    summary="One rank's torch.profiler trace of a profile request (sent by the collector; docs/traces.md)",
    responses={
        200: {"description": "this rank's trace was already received: that one, the body unread"},
        204: {"description": "check=true: the service waits for this rank's trace; send it"},
    },
)
async def upload_profile_trace(
    run_key: RunKey,
    profile_id: Annotated[int, PathParam(ge=1, le=INT64_MAX)],
    request: Request,
    response: Response,
    rank: Annotated[int, Query(ge=0, le=1_000_000, description="the rank that profiled")],
    check: Annotated[bool, Query(description="ask whether to send the trace, with no body (see above)")] = False,
    size: Annotated[
        int | None,
        Query(alias="bytes", ge=0, le=INT64_MAX, description="check=true: the trace's size; 413 past the limit"),
    ] = None,
    file: Annotated[str, file_name("the trace's file name on the job's disk, shown on the run page")] = "trace.json.gz",
) -> ProfileTraceStored:
    factory = request.app.state.session_factory
    earlier = await run_in_threadpool(_received_before, factory, run_key, profile_id, rank)
    if earlier is not None:
        response.status_code = 200
        return earlier
    if check:
        limit = settings_of(request).max_trace_bytes
        if size is not None and size > limit:
            raise TooLarge("bytes", f"the trace is {size} bytes, over {limit} (the service's --max-trace-bytes)")
        return Response(status_code=204)  # type: ignore[return-value] # FastAPI sends a Response as it is
    async with received_trace(request, file) as path:
        stored, created = await run_in_threadpool(_store, request, run_key, profile_id, rank, path)
    if created:
        request.app.state.background.news()
    else:
        response.status_code = 200  # another upload of this rank was stored while this one was read
    return stored


@router.get(
    "/{run_key}/profiles",
    response_model=ProfilesOut,
    summary="The run's profile requests, newest first, with the traces their ranks uploaded",
)
def list_profiles(run_key: RunKey, session: DbSession) -> ProfilesOut:
    run = require_run(session, run_key)
    profiles = (CaptureRequest.run_id == run.id) & (CaptureRequest.kind == "profile")
    total = session.scalar(select(func.count()).select_from(CaptureRequest).where(profiles)) or 0
    requests = session.scalars(
        select(CaptureRequest).where(profiles).order_by(CaptureRequest.id.desc()).limit(PROFILES_LISTED)
    ).all()
    traces: dict[int, list[ProfileTraceOut]] = {request.id: [] for request in requests}
    for row in session.scalars(
        select(ProfileTrace).where(ProfileTrace.request_id.in_(traces)).order_by(ProfileTrace.rank)
    ):
        traces[row.request_id].append(
            ProfileTraceOut(rank=row.rank, file=row.file, bytes=row.bytes, uploaded_at=as_utc(row.uploaded_at))
        )
    return ProfilesOut(
        run_key=run_key,
        total=total,
        profiles=[
            ProfileOut(
                id=request.id,
                from_step=request.from_step,
                steps=request.steps,
                asked_at=as_utc(request.created_at),
                upload_ranks=request.upload_ranks or [],
                run_key=profile_run_key(run_key, request.id),
                traces=traces[request.id],
            )
            for request in requests
        ],
    )


def _profile(session: Session, run_key: str, profile_id: int, rank: int) -> tuple[Run, CaptureRequest]:
    """The run and its profile request, the rank one of those that upload; 404 or 422 naming what is wrong."""
    run = require_run(session, run_key)
    profile = session.get(CaptureRequest, profile_id)
    if profile is None or profile.run_id != run.id or profile.kind != "profile":
        raise NotFound("profile_id", f"run {run_key!r} has no profile {profile_id}")
    if rank not in (profile.upload_ranks or []):
        raise Invalid("rank", f"rank {rank} does not upload profile {profile_id}: ranks {profile.upload_ranks} do")
    return run, profile


def _received_before(
    factory: sessionmaker[Session], run_key: str, profile_id: int, rank: int
) -> ProfileTraceStored | None:
    with transaction(factory) as session:
        _run, profile = _profile(session, run_key, profile_id, rank)
        row = session.get(ProfileTrace, (profile_id, rank))
        return None if row is None else _stored(row, profile, profile_run_key(run_key, profile_id))


def _stored(row: ProfileTrace, profile: CaptureRequest, trace_key: str) -> ProfileTraceStored:
    return ProfileTraceStored(
        profile_id=profile.id,
        rank=row.rank,
        file=row.file,
        bytes=row.bytes,
        uploaded_at=as_utc(row.uploaded_at),
        run_key=trace_key,  # the run it was imported as: no other holds that key (``_store`` refuses one)
        steps=list(range(profile.from_step, profile.from_step + profile.steps)),
    )


def _store(request: Request, run_key: str, profile_id: int, rank: int, path: Path) -> tuple[ProfileTraceStored, bool]:
    """The trace stored, and True; or the rank's trace another upload stored first, and False."""
    trace_key = profile_run_key(run_key, profile_id)
    imported = converted(path, trace_key)
    with transaction(request.app.state.session_factory) as session:  # a refusal part-way rolls back every write
        # One upload of this profile at a time, across processes: a no-op UPDATE takes the request's row lock on
        # PostgreSQL and the write lock on SQLite before anything is read (store.runs.lock_run's reasoning).
        session.execute(update(CaptureRequest).where(CaptureRequest.id == profile_id).values(id=CaptureRequest.id))
        run, profile = _profile(session, run_key, profile_id, rank)
        stored = session.get(ProfileTrace, (profile_id, rank))
        if stored is not None:
            return _stored(stored, profile, trace_key), False
        _check(imported, rank, profile)
        taken = find_run(session, trace_key)  # before the links: a run and its first link are committed together
        linked = set(session.scalars(select(ProfileTrace.trace_run_id).where(ProfileTrace.request_id == profile_id)))
        if taken is not None and taken.id not in linked:
            raise Conflict("profile_id", f"run {trace_key!r} exists and is not profile {profile_id}'s traces")
        name = f"{run.name[:80]} profile steps {profile.from_step}-{profile.from_step + profile.steps - 1}"
        store_imported(session, request, imported, trace_key, name)
        trace_run = require_run(session, trace_key)
        row = ProfileTrace(
            request_id=profile_id, rank=rank, trace_run_id=trace_run.id, file=path.name, bytes=path.stat().st_size
        )
        session.add(row)
        touch_run(session, run.id)  # news: the profiled run's page lists the trace
        session.flush()
        session.refresh(row)
        return _stored(row, profile, trace_key), True


def _check(imported: ImportedRank, rank: int, profile: CaptureRequest) -> None:
    """The trace is the rank it is sent as, and holds profiled steps only (a profiler's warm-up is never kept)."""
    if imported.rank != rank:
        raise Invalid("body", f"the trace is rank {imported.rank}'s, sent as rank {rank}'s")
    profiled = range(profile.from_step, profile.from_step + profile.steps)
    outside = [step for step in imported.steps if step not in profiled]
    if not imported.steps or outside:
        raise Invalid(
            "body",
            f"the trace's steps {imported.steps[:5]} are not profile {profile.id}'s steps "
            f"{profiled.start}-{profiled.stop - 1}",
        )
