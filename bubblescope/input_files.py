"""The files a command reads (traces, dumps): each must exist before any is read."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def missing_files(command: str, paths: Sequence[str | Path]) -> str | None:
    """The one-line refusal of ``command`` when any of ``paths`` is not a file; None when all are."""
    missing = [str(path) for path in paths if not Path(path).is_file()]
    return f"bubblescope {command}: no such file: {', '.join(missing)}" if missing else None
