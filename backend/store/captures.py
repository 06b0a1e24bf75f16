"""Capture requests a rank has not finished: what the answer to its ingest batch carries (and the capture
endpoint answers), as ``CaptureOut``s: the API's shape of a request, kept here because two features answer
with it (and under the name the OpenAPI document has always given it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Row, bindparam, select
from sqlalchemy.orm import Session

from bubblescope.backend.db.models import CaptureRequest

MAX_PENDING_IN_ANSWER = 16


@dataclass(frozen=True)
class CaptureOut:
    """A capture request: every rank ships full spans of steps [from_step, from_step + steps) (``kind`` "spans"),
    or runs torch.profiler over them ("profile"), and then ``upload_ranks`` upload their traces."""

    id: int
    steps: int
    from_step: int
    kind: str = "spans"
    upload_ranks: list[int] | None = None


def pending_captures(session: Session, run_id: int, shipped_through: int) -> list[CaptureOut]:
    """Requests a rank that has shipped steps up to ``shipped_through`` has not finished, oldest first."""
    return [
        CaptureOut(row.id, row.steps, row.from_step, row.kind, row.upload_ranks)
        for row in unfinished_requests(session, run_id, shipped_through)
    ]


def unfinished_requests(
    session: Session, run_id: int, shipped_through: int
) -> Sequence[Row[tuple[int, int, int, str, list[int] | None]]]:
    """The newest ``MAX_PENDING_IN_ANSWER`` requests that end past ``shipped_through``, oldest first:
    rows of (id, from_step, steps, kind, upload_ranks)."""
    return list(
        reversed(session.connection().execute(_UNFINISHED, {"run_id": run_id, "shipped": shipped_through}).all())
    )


_REQUESTS = CaptureRequest.__table__.c
_UNFINISHED = (  # asked on every ingest batch: built once, and rows rather than ORM objects
    select(_REQUESTS.id, _REQUESTS.from_step, _REQUESTS.steps, _REQUESTS.kind, _REQUESTS.upload_ranks)
    .where(
        _REQUESTS.run_id == bindparam("run_id"),
        _REQUESTS.from_step + _REQUESTS.steps - 1 > bindparam("shipped"),
    )
    .order_by(_REQUESTS.id.desc())
    .limit(MAX_PENDING_IN_ANSWER)
)
