"""Collector configuration from ``init()`` arguments, then ``BUBBLESCOPE_*`` environment variables."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

_TRUE = {"1", "true", "yes", "on"}


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def default_spool_dir() -> Path:
    """Where undeliverable batches wait for a later upload."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if not os.access(os.path.dirname(base) or ".", os.W_OK):
        base = tempfile.gettempdir()
    return Path(base) / "bubblescope" / "spool"


@dataclass(frozen=True)
class CollectorConfig:
    """Everything the collector needs; immutable once ``init`` has run."""

    url: str | None
    token: str | None
    run_name: str
    run_key: str | None
    spool_dir: Path
    disabled: bool = False
    flush_interval_s: float = 1.0
    max_batch_spans: int = 20_000
    queue_steps: int = 4096
    max_buffered_spans: int = 100_000
    request_timeout_s: float = 5.0
    max_attempts: int = 3
    spool_max_bytes: int = 256 * 1024 * 1024
    full_spans_every: int = 1
    shutdown_timeout_s: float = 10.0

    @classmethod
    def resolve(
        cls,
        *,
        run: str | None = None,
        url: str | None = None,
        token: str | None = None,
        run_key: str | None = None,
        spool_dir: str | os.PathLike[str] | None = None,
        full_spans_every: int | None = None,
        flush_interval_s: float | None = None,
        request_timeout_s: float | None = None,
    ) -> CollectorConfig:
        env = os.environ
        every = full_spans_every or int(env.get("BUBBLESCOPE_FULL_SPANS_EVERY", "1") or 1)
        return cls(
            url=(url or env.get("BUBBLESCOPE_URL") or None),
            token=token or env.get("BUBBLESCOPE_TOKEN") or None,
            run_name=run or env.get("BUBBLESCOPE_RUN") or "unnamed-run",
            run_key=run_key or env.get("BUBBLESCOPE_RUN_ID") or None,
            spool_dir=Path(spool_dir or env.get("BUBBLESCOPE_SPOOL_DIR") or default_spool_dir()),
            disabled=_env_flag("BUBBLESCOPE_DISABLED"),
            full_spans_every=max(1, every),
            flush_interval_s=flush_interval_s or float(env.get("BUBBLESCOPE_FLUSH_INTERVAL_S", "1.0")),
            request_timeout_s=request_timeout_s
            or float(env.get("BUBBLESCOPE_REQUEST_TIMEOUT_S", "5.0")),
        )
