"""A run's revision after its batches commit (``store.touch``): the first batch after a quiet spell bumps
at once; the batches that follow within the window share one bump, which a read settles at once or the
window's end makes. Every batch is followed by a bump; far fewer bumps than batches. Real SQLite; a
window of ``WINDOW_S`` (the service's is ``TOUCH_EVERY_S``) so that a loaded machine cannot close it early."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from bubblescope.backend.db.engine import build_engine, build_session_factory, transaction
from bubblescope.backend.db.models import Run
from bubblescope.backend.store.runs import register_run
from bubblescope.backend.store.touch import RunToucher
from tests.support import migrated_database, wait_until

KEY = "touched"
WINDOW_S = 3.0


def touched_run(url: str) -> tuple[sessionmaker[Session], int, Callable[[], int]]:
    """A session factory on ``url``, a run registered in it, and a reader of its revision."""
    sessions = build_session_factory(build_engine(url))
    with transaction(sessions) as session:
        run_id = register_run(session, KEY, "touch", 2, {}, lambda _config: None).id

    def revision() -> int:
        with transaction(sessions) as session:
            return session.scalar(select(Run.revision).where(Run.id == run_id)) or 0

    return sessions, run_id, revision


def test_batches_in_one_window_share_a_bump_that_a_read_settles_or_the_window_ends(tmp_path: Path) -> None:
    with migrated_database("sqlite", tmp_path) as url:
        sessions, run_id, revision = touched_run(url)
        toucher = RunToucher(sessions, every_s=WINDOW_S)
        before = revision()

        def commit_batches(count: int) -> None:
            with transaction(sessions) as session:  # as ingest's after-commit does, batch after batch
                for _ in range(count):
                    toucher.committed(session, run_id, KEY)

        commit_batches(20)  # far quicker than the window: the first bumps, the other 19 wait together
        assert revision() == before + 1
        toucher.settle(KEY)  # a read: the waiting bump happens now
        assert revision() == before + 2
        toucher.settle(KEY)  # nothing waits any more
        assert revision() == before + 2

        commit_batches(5)  # still within the window of the settled bump: one bump, at the window's end
        assert revision() == before + 2
        wait_until(lambda: revision() == before + 3, WINDOW_S + 10, "the window's end to bump", interval_s=0.2)
        toucher.settle("another-run")  # a run this process never touched: nothing to do
        assert revision() == before + 3


def test_a_read_arriving_while_another_settles_waits_for_that_bump(tmp_path: Path) -> None:
    """The run page's requests arrive together: the one that does not make the bump must still read
    the bumped revision (they share answers keyed by it). The bump is held up by a write lock here."""
    with migrated_database("sqlite", tmp_path) as url:
        sessions, run_id, revision = touched_run(url)
        toucher = RunToucher(sessions, every_s=WINDOW_S)
        with transaction(sessions) as session:
            toucher.committed(session, run_id, KEY)
            toucher.committed(session, run_id, KEY)  # waits for the window's end, or a read
        before = revision()
        blocker = build_engine(url).connect()
        blocker.exec_driver_sql("BEGIN IMMEDIATE")  # the first reader's bump waits on this lock
        first = threading.Thread(target=toucher.settle, args=(KEY,))
        first.start()
        wait_until(lambda: bump_under_way(toucher, run_id), 10, "the first read to start the bump")
        seen: list[int] = []
        second = threading.Thread(target=lambda: (toucher.settle(KEY), seen.append(revision())))
        second.start()
        second.join(0.5)
        assert second.is_alive()  # it waits for the bump under way
        blocker.rollback()
        blocker.close()
        first.join(10)
        second.join(10)
        assert seen == [before + 1]


def bump_under_way(toucher: RunToucher, run_id: int) -> bool:
    return run_id in toucher._bumping
