"""``serve --retain-days D`` and ``--retain-spans-days S``: every hour, delete the runs not heard from for
D days, and the spans of those not heard from for S days (``deletion.py``)."""

from __future__ import annotations

from typing import Final

from sqlalchemy.orm import Session, sessionmaker

from bubblescope.backend.background import PeriodicTask
from bubblescope.backend.runs.deletion import delete_runs_not_heard_since, delete_spans_not_heard_since
from bubblescope.backend.settings import ServiceSettings

RETENTION_INTERVAL_S: Final = 3600.0


def retention_task(session_factory: sessionmaker[Session], settings: ServiceSettings) -> PeriodicTask | None:
    """The periodic task (its first round when the service starts); None when neither is set."""
    if settings.retain_days is None and settings.retain_spans_days is None:
        return None

    def round_() -> None:
        if settings.retain_days is not None:
            delete_runs_not_heard_since(session_factory, settings.retain_days)
        if settings.retain_spans_days is not None:
            delete_spans_not_heard_since(session_factory, settings.retain_spans_days)

    return PeriodicTask("retention", RETENTION_INTERVAL_S, round_)
