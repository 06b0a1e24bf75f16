"""SQL of the ``api_tokens`` table."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.orm import Session

from bubblescope.backend.db.models import ApiToken, DashboardSession


def find_by_digest(session: Session, digest: str) -> ApiToken | None:
    return session.scalars(select(ApiToken).where(ApiToken.token_hash == digest)).one_or_none()


def active_named(session: Session, name: str) -> ApiToken | None:
    query = select(ApiToken).where(ApiToken.name == name, ApiToken.revoked_at.is_(None))
    return session.scalars(query).first()


def active_matching(session: Session, name_or_prefix: str) -> Sequence[ApiToken]:
    """Tokens not revoked whose name or prefix is ``name_or_prefix``."""
    query = select(ApiToken).where(
        or_(ApiToken.name == name_or_prefix, ApiToken.prefix == name_or_prefix), ApiToken.revoked_at.is_(None)
    )
    return session.scalars(query.order_by(ApiToken.id)).all()


def revoked_matching(session: Session, name_or_prefix: str) -> Sequence[ApiToken]:
    query = select(ApiToken).where(
        or_(ApiToken.name == name_or_prefix, ApiToken.prefix == name_or_prefix), ApiToken.revoked_at.is_not(None)
    )
    return session.scalars(query.order_by(ApiToken.id)).all()


def all_tokens(session: Session) -> Sequence[ApiToken]:
    return session.scalars(select(ApiToken).order_by(ApiToken.created_at, ApiToken.id)).all()


def count_active(session: Session) -> int:
    query = select(func.count()).select_from(ApiToken).where(ApiToken.revoked_at.is_(None))
    return int(session.scalars(query).one())


def insert(
    session: Session, name: str, scope: str, digest: str, prefix: str, runs: list[str] | None = None
) -> ApiToken:
    token = ApiToken(name=name, scope=scope, token_hash=digest, prefix=prefix, runs=runs)
    session.add(token)
    session.flush()
    session.refresh(token)
    return token


def revoke(session: Session, token_id: int) -> None:
    session.execute(update(ApiToken).where(ApiToken.id == token_id).values(revoked_at=func.now()))


def touch(session: Session, token_id: int) -> None:
    """Record that the token was used now (the database's clock)."""
    session.execute(update(ApiToken).where(ApiToken.id == token_id).values(last_used_at=func.now()))


def insert_session(session: Session, token_id: int, digest: str, expires_at: datetime) -> None:
    session.add(DashboardSession(token_id=token_id, session_hash=digest, expires_at=expires_at))
    session.flush()


def find_session(session: Session, digest: str) -> tuple[DashboardSession, ApiToken] | None:
    """The session of ``digest`` with its token, while it is neither ended nor expired (the database's clock)."""
    query = (
        select(DashboardSession, ApiToken)
        .join(ApiToken, ApiToken.id == DashboardSession.token_id)
        .where(
            DashboardSession.session_hash == digest,
            DashboardSession.ended_at.is_(None),
            DashboardSession.expires_at > func.now(),
        )
    )
    row = session.execute(query).one_or_none()
    return None if row is None else (row[0], row[1])


def end_session(session: Session, digest: str) -> None:
    query = update(DashboardSession).where(DashboardSession.session_hash == digest, DashboardSession.ended_at.is_(None))
    session.execute(query.values(ended_at=func.now()))


def purge_sessions(session: Session, before: datetime) -> None:
    """Forget sessions that expired, or ended, before ``before``."""
    session.execute(
        delete(DashboardSession).where(or_(DashboardSession.expires_at < before, DashboardSession.ended_at < before))
    )
