"""API shapes for signing in and for tokens. A token's text appears in one answer only: its creation."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from bubblescope.backend.auth.run_scope import MAX_RUN_PATTERNS, RUN_PATTERN
from bubblescope.backend.auth.tokens import MAX_TOKEN_CHARS, TOKEN_NAME_PATTERN, TOKEN_TEXT_PATTERN
from bubblescope.backend.db.timestamps import as_utc

ScopeName = Literal["ingest", "read", "admin"]  # scopes.Scope's values (tests/auth checks)


class SessionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    token: Annotated[
        str,
        Field(
            min_length=1,
            max_length=MAX_TOKEN_CHARS,
            pattern=TOKEN_TEXT_PATTERN,
            description="a read or admin token (printable ASCII, no space: what fits an Authorization header)",
        ),
    ]


class SessionOut(BaseModel):
    name: str = Field(description="the token's name")
    scope: ScopeName


class TokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(pattern=TOKEN_NAME_PATTERN, description="who or what holds it")]
    scope: ScopeName
    runs: (
        Annotated[
            list[Annotated[str, Field(pattern=RUN_PATTERN)]],
            Field(min_length=1, max_length=MAX_RUN_PATTERNS),
        ]
        | None
    ) = Field(
        None,
        description="the runs it may touch: run keys, or key prefixes ending in * ('team-a-*'); "
        "left out, every run. Not for an admin token",
    )


class TokenOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    name: str
    scope: ScopeName
    runs: list[str] | None = Field(description="the run keys or key prefixes* it may touch; null: every run")
    prefix: str = Field(description="the token's first characters, to tell it apart")
    created_at: datetime
    last_used_at: datetime | None = Field(description="updated at most once a minute")
    revoked_at: datetime | None

    @field_validator("created_at", "last_used_at", "revoked_at")
    @classmethod
    def _in_utc(cls, moment: datetime | None) -> datetime | None:
        return None if moment is None else as_utc(moment)  # SQLite's are naive (and UTC)


class TokenCreatedOut(TokenOut):
    token: str = Field(description="the token itself: shown this once, stored only as its SHA-256")
