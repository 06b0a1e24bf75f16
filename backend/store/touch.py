"""A run's revision and ``updated_at``, bumped after its ingest batches commit: at most every
``TOUCH_EVERY_S`` per run and process.

Every stored answer is valid for one revision (``derived.answers``), so every batch must be followed by a
bump. A 1,024-rank job sends 64 batches a second or more; a bump each was a transaction each, 15% of the
ingest path's time. Here the first batch after a quiet spell bumps at once; the ones that follow within
``TOUCH_EVERY_S`` share one bump, made when the window ends. A read in this process settles a bump
still waiting before it takes the revision, so it never answers from a stale revision; a read in
another process of the deployment may, for at most ``TOUCH_EVERY_S``.
"""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy.orm import Session, sessionmaker

from bubblescope.backend.db.engine import transaction
from bubblescope.backend.store.runs import touch_run

log = logging.getLogger("bubblescope.runs")

TOUCH_EVERY_S = 0.25
SETTLE_WAIT_S = 5.0  # a read waits this long at most for another thread's bump to commit


class RunToucher:
    def __init__(self, session_factory: sessionmaker[Session], every_s: float = TOUCH_EVERY_S) -> None:
        self.session_factory = session_factory
        self.every_s = every_s
        self._lock = threading.Lock()
        self._last: dict[int, float] = {}  # run id → when its last bump began (monotonic)
        self._waiting: dict[int, threading.Timer] = {}  # run id → its bump due at the window's end
        self._bumping: dict[int, threading.Event] = {}  # run id → set when its bump under way has committed
        self._ids: dict[str, int] = {}  # run key → id, for reads, which know the key

    def committed(self, session: Session, run_id: int, run_key: str) -> None:
        """A batch of the run has just committed: bump now in ``session``, or join a bump due soon."""
        with self._lock:
            self._ids[run_key] = run_id
            if run_id in self._waiting:  # due later than this commit: it covers this batch too
                return
            wait = self._last.get(run_id, -self.every_s) + self.every_s - time.monotonic()
            if wait > 0:
                timer = threading.Timer(wait, self._bump_waiting, (run_id,))
                timer.daemon = True
                self._waiting[run_id] = timer
                timer.start()
                return
            self._last[run_id] = time.monotonic()
        touch_run(session, run_id)

    def settle(self, run_key: str) -> None:
        """Make the run's waiting bump now, or wait for one under way: a read is about to take its
        revision (the run page's requests arrive together; each must see the bumped one)."""
        run_id = self._ids.get(run_key)
        if run_id is None:
            return
        if self._take_waiting(run_id):
            self._bump(run_id)
            return
        with self._lock:
            under_way = self._bumping.get(run_id)
        if under_way is not None:
            under_way.wait(SETTLE_WAIT_S)

    def _bump_waiting(self, run_id: int) -> None:
        if self._take_waiting(run_id):  # not settled by a read meanwhile
            self._bump(run_id)

    def _take_waiting(self, run_id: int) -> bool:
        with self._lock:
            timer = self._waiting.pop(run_id, None)
            if timer is None:
                return False
            timer.cancel()
            self._last[run_id] = time.monotonic()
            self._bumping[run_id] = threading.Event()
            return True

    def _bump(self, run_id: int) -> None:
        try:
            with transaction(self.session_factory) as session:
                touch_run(session, run_id)
        except Exception:  # the next batch's bump covers it; a read may answer stale until then
            log.exception("bubblescope: bumping run id %s failed", run_id)
        finally:
            with self._lock:
                done = self._bumping.pop(run_id, None)
            if done is not None:
                done.set()
