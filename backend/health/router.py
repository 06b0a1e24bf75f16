"""Liveness and readiness, for load balancers, orchestrators and people.

- ``GET /api/v1/health`` (liveness): the process answers. It never touches the database, so an
  orchestrator does not restart a healthy service because its database is away; it does say what
  the last request saw of the database (``database``: ``ok``, or ``unavailable`` with since when
  and why), so a person reading it is not told "ok" while every write fails.
- ``GET /api/v1/ready`` (readiness): the database answers within its timeout and its schema is at
  the revision this version needs. 503 with ``Retry-After`` otherwise: take this process out of
  rotation until it passes again (no restart needed; connections are re-made).

Both are public. With ``--auth`` the database's own error words (its host and port among them) go only to a
caller that sends a valid token; others learn that it is unavailable, not where it is.
"""

from __future__ import annotations

import threading
import time
from typing import Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field
from sqlalchemy import text

from bubblescope import __version__, wire
from bubblescope.backend.db import migrate
from bubblescope.backend.errors import (
    ApiError,
    database_unavailable,
    database_unavailable_error,
    first_line,
    sees_internals,
)
from bubblescope.backend.settings import settings_of

router = APIRouter(prefix=wire.API_PREFIX, tags=["meta"])  # auth.guard notes a valid credential here
WITHHELD = "withheld: send a token to see the database's error"


class DatabaseStatus:
    """What the service last saw of its database; written from worker threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.unavailable_since: float | None = None
        self.reason = ""

    def failed(self, reason: str) -> None:
        with self._lock:
            if self.unavailable_since is None:
                self.unavailable_since = time.time()
            self.reason = reason

    def answered(self) -> None:
        with self._lock:
            self.unavailable_since = None
            self.reason = ""


class HealthOut(BaseModel):
    status: Literal["ok"]
    version: str
    database: Literal["ok", "unavailable"] = Field(description="as the last request or readiness check saw it")
    database_unavailable_since: float | None = Field(description="epoch seconds; null when available")
    database_error: str | None
    background: Literal["leader", "standby"] = Field(
        description="leader: this process runs the alert rules, deliveries and retention; standby: another "
        "process on the same PostgreSQL database does (docs/scale.md)"
    )


class ReadyOut(BaseModel):
    status: Literal["ready"]
    schema_revision: str


@router.get("/health", response_model=HealthOut, summary="Liveness: the process answers (no database query)")
async def health(request: Request) -> HealthOut:  # on the event loop: answers while worker threads are busy
    status: DatabaseStatus = request.app.state.database
    since = status.unavailable_since
    return HealthOut(
        status="ok",
        version=__version__,
        database="ok" if since is None else "unavailable",
        database_unavailable_since=since,
        database_error=(status.reason if sees_internals(request) else WITHHELD) if status.reason else None,
        background="leader" if request.app.state.background.leadership.leading else "standby",
    )


@router.get(
    "/ready",
    response_model=ReadyOut,
    summary="Readiness: the database answers and its schema is current (503 with Retry-After otherwise)",
    responses={503: {"description": "the database is unreachable or its schema is not at this version's revision"}},
)
def ready(request: Request) -> ReadyOut:
    status: DatabaseStatus = request.app.state.database
    retry_after_s = settings_of(request).retry_after_s
    try:
        with request.app.state.engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        revision = migrate.current_revision(request.app.state.engine)
    except Exception as error:
        if not database_unavailable(error):
            raise
        status.failed(first_line(error))
        raise database_unavailable_error(error, retry_after_s, ["database"], sees_internals(request)) from None
    head: str = request.app.state.schema_head
    if revision is None or revision != head:
        status.failed(f"schema at revision {revision}, this version needs {head}")
        raise ApiError(
            503,
            ["database", "schema_revision"],
            f"schema at revision {revision or 'none'}, this version needs {head}: run bubblescope db upgrade",
            "schema_out_of_date",
            {"Retry-After": str(retry_after_s)},
        )
    status.answered()
    return ReadyOut(status="ready", schema_revision=revision)
