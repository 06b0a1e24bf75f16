"""The collector's C hot path (``_hotpath``, built from ``collector/_hotpath.c`` at install), if usable.

``hotpath`` is the module, or None when it was not built (no C compiler at install), when
``BUBBLESCOPE_PURE_PYTHON=1`` asks for the Python wrappers, or when its clock does not agree with
the recorder's (``clock.local_ns``): the C wrappers read ``CLOCK_MONOTONIC``, which is
``time.perf_counter_ns`` on Linux; elsewhere it may not be, and the spans of both would not line up.
Either way the collector records the same spans; the Python wrappers cost more per action.
"""

from __future__ import annotations

import os
from types import ModuleType

from bubblescope.collector.clock import local_ns


def _clock_agrees(module: ModuleType, reads: int = 5) -> bool:
    """Each C reading falls between two readings of ``local_ns``."""
    for _ in range(reads):
        before, native, after = local_ns(), module.now_ns(), local_ns()
        if not before <= native <= after:
            return False
    return True


def load() -> ModuleType | None:
    if os.environ.get("BUBBLESCOPE_PURE_PYTHON", "").strip().lower() in ("1", "true", "yes"):
        return None
    try:
        from bubblescope.collector import _hotpath
    except ImportError:
        return None
    return _hotpath if _clock_agrees(_hotpath) else None


hotpath: ModuleType | None = load()
