"""Collector configuration from ``init()`` arguments, then ``BUBBLESCOPE_*`` environment variables.

A malformed environment value never stops the job: it is reported once, naming the variable,
and the default is used instead.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

log = logging.getLogger("bubblescope.collector")

_TRUE = {"1", "true", "yes", "on"}
NumberT = TypeVar("NumberT", int, float)

DEFAULT_FULL_SPANS_EVERY = 10
"""Full spans of every 10th step (aggregates of every step): a tenth of the span volume, and
still a sampled step every few seconds at typical step times. Capture requests add steps."""


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def env_number(name: str, default: NumberT, parse: Callable[[str], NumberT], minimum: NumberT) -> NumberT:
    """``name`` from the environment as a number >= ``minimum``; the default (with a warning) if bad."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = parse(raw)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value < minimum:
        log.warning("bubblescope: %s=%r is not a number >= %s; using %s", name, raw, minimum, default)
        return default
    return value


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
    full_spans_every: int = DEFAULT_FULL_SPANS_EVERY
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
        every = full_spans_every or env_number("BUBBLESCOPE_FULL_SPANS_EVERY", DEFAULT_FULL_SPANS_EVERY, int, 1)
        return cls(
            url=(url or env.get("BUBBLESCOPE_URL") or None),
            token=token or env.get("BUBBLESCOPE_TOKEN") or None,
            run_name=run or env.get("BUBBLESCOPE_RUN") or "unnamed-run",
            run_key=run_key or env.get("BUBBLESCOPE_RUN_ID") or None,
            spool_dir=Path(spool_dir or env.get("BUBBLESCOPE_SPOOL_DIR") or default_spool_dir()),
            disabled=_env_flag("BUBBLESCOPE_DISABLED"),
            full_spans_every=max(1, every),
            flush_interval_s=flush_interval_s
            or env_number("BUBBLESCOPE_FLUSH_INTERVAL_S", cls.flush_interval_s, float, 0.001),
            request_timeout_s=request_timeout_s
            or env_number("BUBBLESCOPE_REQUEST_TIMEOUT_S", cls.request_timeout_s, float, 0.001),
            spool_max_bytes=env_number("BUBBLESCOPE_SPOOL_MAX_BYTES", cls.spool_max_bytes, int, 0),
            shutdown_timeout_s=env_number("BUBBLESCOPE_SHUTDOWN_TIMEOUT_S", cls.shutdown_timeout_s, float, 0.0),
        )
