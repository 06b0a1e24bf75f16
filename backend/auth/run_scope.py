"""Tokens bound to runs: which runs a token may touch.

A token's ``runs`` is None (every run: what every token created before this existed has) or a list of
patterns, each a run key (that run only) or a key prefix ending in ``*`` (``team-a-*``: every run whose key
starts with ``team-a-``). An ``ingest`` token so bound can register, write and end only those runs; a ``read``
token can list, open and act on only those (``GET /runs`` and ``GET /alerts`` leave the others out). An
``admin`` token is never bound: it manages every team's tokens and runs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

MAX_RUN_PATTERNS: Final = 32
RUN_PATTERN: Final = r"^[A-Za-z0-9._:-]{1,128}\*?$"
"""A run key (the characters of ``fields.RUN_KEY_PATTERN``), or a prefix of one followed by ``*``."""


def run_patterns_problem(patterns: Sequence[str]) -> str | None:
    """Why ``patterns`` cannot bind a token to runs, or None."""
    if not patterns:
        return "lists no run: leave it out for every run, or name at least one key or prefix*"
    if len(patterns) > MAX_RUN_PATTERNS:
        return f"lists {len(patterns)} patterns; at most {MAX_RUN_PATTERNS}"
    for pattern in patterns:
        if not re.fullmatch(RUN_PATTERN, pattern):
            return (
                f"{pattern!r} is neither a run key nor a key prefix ending in '*' "
                "(letters, digits and . _ : -, at most 128, then an optional *)"
            )
    return None
