"""The one FastAPI session dependency: it owns commit and rollback for the request.

``scope="function"`` makes the commit happen before the response is sent, so a client that
got a 2xx can rely on the data being stored (FastAPI otherwise runs the teardown afterwards).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from bubblescope.backend.db.engine import transaction


def get_session(request: Request) -> Iterator[Session]:
    with transaction(request.app.state.session_factory) as session:
        yield session
    database_answered(request)


def database_answered(request: Request) -> None:
    """A request's transaction committed: the database is back, if it was away."""
    if request.app.state.database.unavailable_since is not None:
        request.app.state.database.answered()


DbSession = Annotated[Session, Depends(get_session, scope="function")]
