"""The SQL of alert delivery: the webhook outbox (``alert_deliveries``) and the alerts Alertmanager is told about.

A row of the outbox is one notification (an alert's firing or its resolution) for one webhook URL:
- pending: ``delivered_at`` NULL and ``next_attempt_at`` a real time (due once it has passed);
- delivered: ``delivered_at`` set;
- given up: ``delivered_at`` NULL and ``next_attempt_at`` = ``GIVEN_UP`` (``last_error`` says why).

A sender claims a row by raising its ``attempts`` from the value it read (and moving
``next_attempt_at`` a lease ahead), so two service processes on one database never send the same
row at once, and a process that dies while sending leaves a row that is due again after the lease.
The outbox runs on the service's wall clock (UTC), the only clock it compares with itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal

from sqlalchemy import exists, or_, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session, aliased

from bubblescope.backend.db.models import Alert, AlertDelivery
from bubblescope.backend.db.upsert import insert_on_conflict

GIVEN_UP = datetime(9999, 12, 31, tzinfo=timezone.utc)
ERROR_CHARS = 1000  # the column's length


def wall_clock() -> datetime:
    return datetime.now(timezone.utc)


def add_pending(
    session: Session, alert_id: int, status: Literal["firing", "resolved"], targets: Iterable[str], now: datetime
) -> None:
    """One pending row per target; a notification already in the outbox is left as it is."""
    rows = [
        {"alert_id": alert_id, "target": target, "status": status, "attempts": 0, "next_attempt_at": now}
        for target in dict.fromkeys(targets)
    ]
    insert_on_conflict(session, AlertDelivery, rows, ["alert_id", "target", "status"])


@dataclass(frozen=True)
class Claimed:
    delivery_id: int
    status: Literal["firing", "resolved"]
    attempts: int  # this attempt's number, from 1
    alert: Alert


def claim_next(session: Session, target: str, now: datetime, lease_until: datetime) -> Claimed | None:
    """The oldest due notification for ``target``, claimed until ``lease_until``; None when none is due.

    An alert's resolution waits while its firing is still pending for the same target, so a receiver
    never hears of the end before the start."""
    earlier = aliased(AlertDelivery)
    waits_for_earlier = exists().where(
        earlier.alert_id == AlertDelivery.alert_id,
        earlier.target == AlertDelivery.target,
        earlier.id < AlertDelivery.id,
        earlier.delivered_at.is_(None),
        earlier.next_attempt_at != GIVEN_UP,
    )
    query = (
        select(AlertDelivery, Alert)
        .join(Alert, Alert.id == AlertDelivery.alert_id)
        .where(
            AlertDelivery.target == target,
            AlertDelivery.delivered_at.is_(None),
            AlertDelivery.next_attempt_at <= now,
            ~waits_for_earlier,
        )
        .order_by(AlertDelivery.next_attempt_at, AlertDelivery.id)
        .limit(1)
    )
    row = session.execute(query).first()
    if row is None:
        return None
    delivery, alert = row
    claim = (
        update(AlertDelivery)
        .where(
            AlertDelivery.id == delivery.id,
            AlertDelivery.attempts == delivery.attempts,
            AlertDelivery.delivered_at.is_(None),
        )
        .values(attempts=delivery.attempts + 1, next_attempt_at=lease_until)
        .execution_options(synchronize_session=False)
    )
    result: CursorResult[tuple[()]] = session.execute(claim)  # type: ignore[assignment]
    if result.rowcount != 1:
        return None  # another process claimed it first; the next round looks again
    status: Literal["firing", "resolved"] = "firing" if delivery.status == "firing" else "resolved"
    return Claimed(delivery.id, status, delivery.attempts + 1, alert)


def mark_delivered(session: Session, delivery_id: int, now: datetime) -> None:
    _set(session, delivery_id, delivered_at=now, last_error=None)


def mark_failed(session: Session, delivery_id: int, error: str, retry_at: datetime) -> None:
    _set(session, delivery_id, next_attempt_at=retry_at, last_error=error[:ERROR_CHARS])


def mark_given_up(session: Session, delivery_id: int, error: str) -> None:
    _set(session, delivery_id, next_attempt_at=GIVEN_UP, last_error=f"gave up: {error}"[:ERROR_CHARS])


def _set(session: Session, delivery_id: int, **values: object) -> None:
    session.execute(
        update(AlertDelivery)
        .where(AlertDelivery.id == delivery_id)
        .values(**values)
        .execution_options(synchronize_session=False)
    )


def firing_alerts(session: Session) -> Sequence[Alert]:
    return session.scalars(select(Alert).where(Alert.ends_at.is_(None)).order_by(Alert.id)).all()


def resolved_since(session: Session, since: datetime) -> Sequence[Alert]:
    """Alerts resolved (or changed after resolving) at or after ``since``."""
    query = select(Alert).where(Alert.ends_at.is_not(None), or_(Alert.ends_at >= since, Alert.updated_at >= since))
    return session.scalars(query.order_by(Alert.id)).all()
