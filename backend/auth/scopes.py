"""The scopes a token can have, and which scope grants which.

``admin`` grants everything (``read`` and ``ingest`` too): one token can run the service. ``read`` and
``ingest`` are apart: a collector's token cannot read runs, a dashboard reader cannot write them.
"""

from __future__ import annotations

from enum import Enum
from typing import Final, Literal


class Scope(str, Enum):
    INGEST = "ingest"
    READ = "read"
    ADMIN = "admin"


PUBLIC: Final = "public"
"""A route anyone may call, with auth on too (health, the dashboard's pages and assets, signing in)."""

Access = Scope | Literal["public"]
SCOPE_NAMES: Final = tuple(scope.value for scope in Scope)
SIGN_IN_SCOPES: Final = (Scope.READ, Scope.ADMIN)
"""The scopes a dashboard session may be opened with (an ingest token is for collectors)."""


def grants(held: Scope, needed: Scope) -> bool:
    """Whether a token of scope ``held`` may call a route that needs ``needed``."""
    return held is needed or held is Scope.ADMIN
