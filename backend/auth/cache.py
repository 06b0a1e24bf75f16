"""Known tokens, remembered for a few seconds, so that an ingest batch does not pay a query.

A token is looked up by its SHA-256 digest: in this cache first, then in the database. What the
database said (the token, its scope, whether it is revoked, or that it is unknown) is kept for
``TTL_S`` seconds: **a revocation takes effect within that long** in every ``serve`` process (at once
in the process that revoked it through the API, which forgets what it knew). Unknown digests are
kept too, so a client retrying a bad token costs no query either; the cache holds at most
``MAX_ENTRIES`` digests, the oldest forgotten first.

``last_used_at`` is written at most once a minute per token and process (``TOUCH_EVERY_S``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from bubblescope.backend.auth import queries
from bubblescope.backend.auth.scopes import Scope
from bubblescope.backend.auth.tokens import same_digest
from bubblescope.backend.caller import RunScope
from bubblescope.backend.db.engine import transaction
from bubblescope.backend.db.models import ApiToken

TTL_S = 5.0
SESSION_KEY = "session:"
"""A dashboard session's cache key: this and its digest (``cached(SESSION_KEY + digest)``)."""
MAX_ENTRIES = 10_000
TOUCH_EVERY_S = 60.0
log = logging.getLogger("bubblescope.auth")


@dataclass(frozen=True)
class KnownToken:
    id: int
    name: str
    scope: Scope
    digest: str
    revoked: bool
    runs: RunScope = None  # None: every run (``run_scope``)


@dataclass(frozen=True)
class _Entry:
    token: KnownToken | None  # None: no such token
    fetched_at: float


class TokenCache:
    def __init__(
        self,
        session_factory: sessionmaker[Session],
        ttl_s: float = TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session_factory = session_factory
        self.ttl_s = ttl_s
        self.clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._touched_at: dict[int, float] = {}

    def cached(self, digest: str, session: bool = False) -> tuple[bool, KnownToken | None]:
        """(known here, the token; of a dashboard session's digest with ``session``): (False, None) when the
        database must be asked."""
        with self._lock:
            entry = self._entries.get(SESSION_KEY + digest if session else digest)
            if entry is None or self.clock() - entry.fetched_at > self.ttl_s:
                return False, None
        return True, _checked(entry.token, digest)

    def load_session(self, digest: str) -> KnownToken | None:
        """The token of the dashboard session ``digest`` (None: no such session, ended or expired), from the
        database, remembered like a token (under ``SESSION_KEY`` + digest, so the two never mix)."""
        with transaction(self.session_factory) as session:
            found = queries.find_session(session, digest)
            # under the session's digest: what ``_checked`` compares with what was presented
            token = None if found is None else _known(found[1], digest)
        self._remember(SESSION_KEY + digest, token)
        return _checked(token, digest)

    def remembered(self, digest: str, session: bool = False) -> KnownToken | None:
        """What the database last said of ``digest``, however long ago (None: nothing): for saying more to a
        known caller while the database is away, or to a throttled client, never for granting access alone."""
        with self._lock:
            entry = self._entries.get(SESSION_KEY + digest if session else digest)
        return None if entry is None else _checked(entry.token, digest)

    def load(self, digest: str) -> KnownToken | None:
        """The token of ``digest`` from the database (a worker thread's call), remembered."""
        with transaction(self.session_factory) as session:
            row = queries.find_by_digest(session, digest)
            token = None if row is None else _known(row, row.token_hash)
        self._remember(digest, token)
        return _checked(token, digest)

    def _remember(self, key: str, token: KnownToken | None) -> None:
        with self._lock:
            self._entries.pop(key, None)  # re-inserted last: the oldest are first
            if len(self._entries) >= MAX_ENTRIES:
                self._entries.pop(next(iter(self._entries)))
            self._entries[key] = _Entry(token, self.clock())

    def forget_session(self, digest: str) -> None:
        """Ask the database again about this session (signed out here); the rest stays."""
        with self._lock:
            self._entries.pop(SESSION_KEY + digest, None)

    def forget(self) -> None:
        """Ask the database again next time (a token was revoked in this process)."""
        with self._lock:
            self._entries.clear()

    def claim_touch(self, token_id: int) -> bool:
        """Whether this call should record the token's use now (at most once per ``TOUCH_EVERY_S``)."""
        now = self.clock()
        with self._lock:
            last = self._touched_at.get(token_id)
            if last is not None and now - last < TOUCH_EVERY_S:
                return False
            self._touched_at[token_id] = now
            return True

    def touch(self, token_id: int) -> None:
        """Write ``last_used_at`` (a worker thread's call); a failure is logged, never fails the request."""
        try:
            with transaction(self.session_factory) as session:
                queries.touch(session, token_id)
        except SQLAlchemyError as error:
            log.warning("bubblescope: could not record the use of token %d: %s", token_id, error)


def _known(row: ApiToken, digest: str) -> KnownToken:
    """What the cache keeps of a token's row, found by ``digest`` (its own, or a session's of it)."""
    runs = None if row.runs is None else tuple(row.runs)
    return KnownToken(row.id, row.name, Scope(row.scope), digest, row.revoked_at is not None, runs)


def _checked(token: KnownToken | None, digest: str) -> KnownToken | None:
    return token if token is not None and same_digest(token.digest, digest) else None
