"""Timestamps as the databases hand them back: one rule for both."""

from __future__ import annotations

from datetime import datetime, timezone


def as_utc(moment: datetime) -> datetime:
    """SQLite hands back naive datetimes that are UTC (CURRENT_TIMESTAMP); PostgreSQL aware ones."""
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment
