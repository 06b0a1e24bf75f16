"""Run endpoints: registration by the collector, and the read views for people and machines."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from bubblescope import wire
from bubblescope.backend.body import json_body_doc, parse_document, read_json
from bubblescope.backend.caller import run_scope_of
from bubblescope.backend.db.session import DbSession
from bubblescope.backend.derived.answers import cached_answer
from bubblescope.backend.errors import Invalid
from bubblescope.backend.fields import INT32_MAX, INT64_MAX, STEP_MAX, RankIndex, RunKey, StepIndex
from bubblescope.backend.runs import deletion, service
from bubblescope.backend.runs.schemas import (
    RankEndIn,
    RankOut,
    RankRegistration,
    RunDetail,
    RunRegistration,
    RunSummary,
    StepDetail,
)
from bubblescope.backend.runs.trace_export import trace_export
from bubblescope.backend.settings import MAX_SILENT_AFTER_S, settings_of
from bubblescope.backend.store.state import RunStateName

router = APIRouter(prefix=f"{wire.API_PREFIX}/runs", tags=["runs"])


@router.put(
    "/{run_key}",
    response_model=RunSummary,
    openapi_extra=json_body_doc(RunRegistration),
    summary="Create or update a run (every rank may call it; config keys merge)",
)
async def put_run(run_key: RunKey, request: Request, session: DbSession) -> RunSummary:
    registration = parse_document(RunRegistration, await read_json(request))
    return await run_in_threadpool(service.register_run, session, run_key, registration, settings_of(request))


@router.put(
    "/{run_key}/ranks/{rank}",
    response_model=RankOut,
    openapi_extra=json_body_doc(RankRegistration),
    summary="Create or update one rank: host, pid, stage, clock offset to rank 0",
)
async def put_rank(run_key: RunKey, rank: RankIndex, request: Request, session: DbSession) -> RankOut:
    registration = parse_document(RankRegistration, await read_json(request))
    return await run_in_threadpool(service.register_rank, session, run_key, rank, registration)


@router.put(
    "/{run_key}/ranks/{rank}/end",
    response_model=RankOut,
    openapi_extra=json_body_doc(RankEndIn),
    summary="Record how one rank ended: finished, or failed with its error (sent by the collector on exit)",
)
async def put_rank_end(run_key: RunKey, rank: RankIndex, request: Request, session: DbSession) -> RankOut:
    end = parse_document(RankEndIn, await read_json(request))
    ended = await run_in_threadpool(service.end_rank, session, run_key, rank, end)
    request.app.state.background.news()  # a failure pages without waiting the alert rules' interval
    return ended


SilentAfter = Annotated[
    float | None,
    Query(
        gt=0,
        le=MAX_SILENT_AFTER_S,
        description="seconds without news after which a run that has not ended is 'silent' (default: the service's "
        "--silent-after)",
    ),
]


ISO_MOMENT = r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?)?(Z|[+-]\d{2}:?\d{2})?$"


def _moment(field: str, text: str | None) -> datetime | None:
    """An ISO 8601 time from a query parameter (the pattern above passed), or a 422 naming it."""
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise Invalid(field, f"{text!r} is not a time (ISO 8601, e.g. 2026-11-24T10:00:00Z)") from None


def _silent_after(request: Request, asked: float | None) -> float:
    return asked if asked is not None else settings_of(request).silent_after_s


@router.get(
    "",
    response_model=list[RunSummary],
    summary="Runs, most recently active first, each with its state",
    description='When more runs follow, the answer\'s `X-Next-Cursor` header (and `Link: <...>; rel="next"`) '
    "gives the `cursor` of the next page. A run that becomes active again while a client pages moves to "
    "the front: it may be listed twice, and none is skipped.",
)
def get_runs(
    session: DbSession,
    request: Request,
    response: Response,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
    cursor: Annotated[int | None, Query(ge=1, le=INT64_MAX, description="X-Next-Cursor of the page before")] = None,
    silent_after_s: SilentAfter = None,
    state: Annotated[
        list[RunStateName] | None,
        Query(description="only runs in one of these states (repeat for several: ?state=failed&state=silent)"),
    ] = None,
    name: Annotated[
        str | None, Query(max_length=128, description="only runs whose name or key holds this text (any case)")
    ] = None,
    since: Annotated[
        str | None,
        Query(
            pattern=ISO_MOMENT,
            description="only runs heard from at or after this time (ISO 8601, e.g. 2026-11-24T10:00:00Z; "
            "without a zone: UTC)",
        ),
    ] = None,
) -> list[RunSummary]:
    page, following = service.list_runs(
        session,
        limit,
        offset,
        _silent_after(request, silent_after_s),
        state,
        after=cursor,
        name=name,
        since=_moment("since", since),
        run_scope=run_scope_of(request),
    )
    if following is not None:
        response.headers["X-Next-Cursor"] = str(following)
        url = request.url.remove_query_params(["cursor", "offset"]).include_query_params(cursor=following)
        response.headers["Link"] = f'<{url.path}?{url.query}>; rel="next"'
    return page


@router.get("/{run_key}", response_model=RunDetail, summary="A run: state, config, ranks and per-step summary")
def get_run(
    run_key: RunKey,
    session: DbSession,
    request: Request,
    silent_after_s: SilentAfter = None,
    ranks_limit: Annotated[
        int | None,
        Query(
            ge=1,
            le=1_000_000,
            description="list at most this many ranks, those needing attention first (the run page asks for "
            "1,024: a 16,384-rank run's every rank is 4.5 MB); default: every rank",
        ),
    ] = None,
) -> RunDetail:
    return service.run_detail(session, run_key, _silent_after(request, silent_after_s), ranks_limit)


@router.get(
    "/{run_key}/steps/{step}",
    response_model=StepDetail,
    summary="One step: aligned spans, per-rank breakdown, measured vs theoretical bubble",
)
def get_step(
    run_key: RunKey,
    step: StepIndex,
    session: DbSession,
    request: Request,
    ranks: Annotated[
        str | None,
        Query(
            max_length=200,
            description="whose spans to include, e.g. 0-7,341 (at most 64 ranks); default: every rank of a run "
            "of up to 64, else each stage's median and slowest rank. The breakdown always covers every rank.",
        ),
    ] = None,
    breakdown_limit: Annotated[
        int | None,
        Query(
            ge=1,
            le=1_000_000,
            description="at most this many breakdown rows, slowest compute first (the run page asks for 1,024: "
            "a 16,384-rank step's every row is 4.8 MB); default: every rank's, in rank order",
        ),
    ] = None,
) -> Response:
    return cached_answer(
        request, session, run_key, lambda: service.step_detail(session, run_key, step, ranks, breakdown_limit)
    )


@router.get(
    "/{run_key}/trace",
    response_class=JSONResponse,
    summary="Steps as Chrome trace-event JSON for Perfetto or chrome://tracing (docs/traces.md)",
    responses={200: {"description": "a trace-event document (a download): one process per rank, flows send to recv"}},
)
def get_trace(
    run_key: RunKey,
    session: DbSession,
    from_step: Annotated[int | None, Query(ge=0, le=STEP_MAX, description="first step (default: the newest)")] = None,
    to_step: Annotated[int | None, Query(ge=0, le=STEP_MAX, description="last step (default: from_step)")] = None,
    ranks: Annotated[
        str | None,
        Query(
            max_length=200,
            description="whose spans, e.g. 0-7,341 (at most 64 ranks); default: every rank of a run of up to 64, "
            "else each stage's median and slowest",
        ),
    ] = None,
) -> JSONResponse:
    document, file_name = trace_export(session, run_key, from_step, to_step, ranks)
    return JSONResponse(document, headers={"Content-Disposition": f'attachment; filename="{file_name}"'})


@router.delete(
    "/{run_key}",
    status_code=204,
    response_class=Response,
    summary="Delete a run and every row of it (admin): ranks, steps, spans, captures, alerts",
    responses={503: {"description": "the database is unavailable; what was deleted stays deleted, retry"}},
)
async def delete_run(run_key: RunKey, request: Request) -> Response:
    await run_in_threadpool(deletion.delete_run, request.app.state.session_factory, run_key)
    return Response(status_code=204)
