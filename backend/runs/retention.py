"""``serve --retain-days D``: every hour, delete the runs not heard from for D days (``deletion.py``)."""

from __future__ import annotations

from typing import Final

from sqlalchemy.orm import Session, sessionmaker

from bubblescope.backend.background import PeriodicTask
from bubblescope.backend.runs.deletion import delete_runs_not_heard_since

RETENTION_INTERVAL_S: Final = 3600.0


def retention_task(session_factory: sessionmaker[Session], retain_days: float) -> PeriodicTask:
    """The periodic task (its first round when the service starts)."""
    return PeriodicTask("retention", RETENTION_INTERVAL_S, lambda: _delete_old_runs(session_factory, retain_days))


def _delete_old_runs(session_factory: sessionmaker[Session], retain_days: float) -> None:
    delete_runs_not_heard_since(session_factory, retain_days)
