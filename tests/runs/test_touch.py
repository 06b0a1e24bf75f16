"""A run's revision after its batches commit (``runs.touch``): the first batch after a quiet spell bumps
at once; the batches that follow within the window share one bump, which a read settles at once or the
window's end makes. Every batch is followed by a bump; far fewer bumps than batches. Real SQLite; a
window of ``WINDOW_S`` (the service's is ``TOUCH_EVERY_S``) so that a loaded machine cannot close it early."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select

from bubblescope.backend.db.engine import build_engine, build_session_factory, transaction
from bubblescope.backend.db.models import Run
from bubblescope.backend.runs.queries import register_run
from bubblescope.backend.runs.touch import RunToucher
from tests.support import migrated_database, wait_until

KEY = "touched"
WINDOW_S = 3.0


def test_batches_in_one_window_share_a_bump_that_a_read_settles_or_the_window_ends(tmp_path: Path) -> None:
    with migrated_database("sqlite", tmp_path) as url:
        sessions = build_session_factory(build_engine(url))
        with transaction(sessions) as session:
            run_id = register_run(session, KEY, "touch", 2, {}, lambda _config: None).id

        def revision() -> int:
            with transaction(sessions) as session:
                return session.scalar(select(Run.revision).where(Run.id == run_id)) or 0

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
