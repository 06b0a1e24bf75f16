"""The alert rules' costlier figures, computed in a child process of the service.

At 1,024 ranks the bubble analysis and the straggler scoring take a second or two of pure Python
each time a run's figures are refreshed. In the serving process that second holds the GIL, and
every ingest request waits for it: a 1,024-rank job's batches then queue for seconds
(docs/scale.md). In a child process the evaluator's thread only waits for the answer, with the GIL
released. The child opens its own connections to the same database; a child that dies is replaced
at the next refresh. An in-memory SQLite database, which a child cannot open, is computed in process.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from sqlalchemy.orm import Session, sessionmaker

from bubblescope.backend.db.engine import build_engine, build_session_factory, transaction
from bubblescope.backend.derived.figures import ComputedFigures, FigureRequest, compute_figures

log = logging.getLogger("bubblescope.alerts")

CHILD_NICENESS = 10
PARENT_CHECK_S = 1.0
_child_sessions: sessionmaker[Session] | None = None  # the child's own, set by _open


def _open(db_url: str, parent_pid: int) -> None:
    global _child_sessions
    os.nice(CHILD_NICENESS)  # background work: the serving process's requests go first on a busy host
    threading.Thread(target=_exit_with, args=(parent_pid,), name="bubblescope-parent-watch", daemon=True).start()
    _child_sessions = build_session_factory(build_engine(db_url))


def _exit_with(parent_pid: int) -> None:
    """End this child when the service that started it is gone (killed: no shutdown reached the pool)."""
    while os.getppid() == parent_pid:
        time.sleep(PARENT_CHECK_S)
    os._exit(0)


def _compute(asked: FigureRequest) -> ComputedFigures:
    assert _child_sessions is not None  # _open ran first: it is the pool's initializer
    with transaction(_child_sessions) as session:
        return compute_figures(session, asked)


def can_run_apart(db_url: str) -> bool:
    """Whether a child process can open this database (not an in-memory SQLite one)."""
    return not (
        db_url.startswith("sqlite") and (":memory:" in db_url or db_url.rstrip("/") in ("sqlite:", "sqlite+pysqlite:"))
    )


class FigureWorker:
    """One child process, started at the first refresh (``spawn``: no copy of the server's threads)."""

    def __init__(self, db_url: str) -> None:
        self.db_url = db_url
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None

    def compute(self, asked: FigureRequest) -> ComputedFigures:
        with self._lock:
            if self._pool is None:
                context = multiprocessing.get_context("spawn")
                self._pool = ProcessPoolExecutor(
                    1, mp_context=context, initializer=_open, initargs=(self.db_url, os.getpid())
                )
            pool = self._pool
        try:
            return pool.submit(_compute, asked).result()  # submit too raises once the pool knows it broke
        except BrokenProcessPool:
            log.warning("bubblescope: the figure worker died; a new one starts at the next refresh")
            with self._lock:
                if self._pool is pool:
                    self._pool = None
            raise

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
