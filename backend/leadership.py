"""Which process of a deployment does the background work (alert rules, deliveries, retention).

Several ``serve`` processes may share one PostgreSQL database (uvicorn workers, or hosts behind a load
balancer). The background tasks then run in one of them, the leader: the holder of a PostgreSQL
session advisory lock, taken on one connection the process keeps for it. Each task asks before each
round; when the leader dies its connection closes, the lock is released, and another process takes it
at its next round (within a task interval). On SQLite (one process per database file) this process
always leads.
"""

from __future__ import annotations

import hashlib
import logging
import threading

from sqlalchemy import Connection, Engine, text

log = logging.getLogger("bubblescope.leadership")

LOCK_KEY = int.from_bytes(hashlib.sha256(b"bubblescope.background").digest()[:8], "big", signed=True)


class Leadership:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.shared = engine.dialect.name == "postgresql"
        self._connection: Connection | None = None
        self._lock = threading.Lock()
        self.leading = not self.shared  # the last answer of ``leads``, for /health (which asks no database)

    def leads(self) -> bool:
        """Does this process run the background work now? (Takes the lead when it is free.)"""
        if not self.shared:
            return True
        with self._lock:
            self.leading = self._still_held() or self._try_take()
            return self.leading

    def _still_held(self) -> bool:
        if self._connection is None:
            return False
        try:
            self._connection.execute(text("SELECT 1"))
            self._connection.commit()
            return True
        except Exception:  # noqa: BLE001 - the session went away, and its lock with it
            log.warning("bubblescope: lost the background lock with its connection; asking again")
            self._drop()
            return False

    def release(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._drop()
            self.leading = not self.shared

    def _try_take(self) -> bool:
        try:
            connection = self.engine.connect()
        except Exception:  # noqa: BLE001 - no database now: the next round asks again
            return False
        try:
            taken = bool(connection.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": LOCK_KEY}).scalar())
            connection.commit()  # the session lock outlives the transaction; the connection stays open
        except Exception:  # noqa: BLE001
            connection.close()
            return False
        if not taken:
            connection.close()
            return False
        self._connection = connection
        log.info("bubblescope: this process now runs the background work (alert rules, deliveries, retention)")
        return True

    def _drop(self) -> None:
        connection, self._connection = self._connection, None
        try:
            if connection is not None:
                connection.invalidate()  # closes the session for good: its advisory lock goes with it
        except Exception:  # noqa: BLE001
            pass
