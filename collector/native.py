"""The collector's C hot path (``_hotpath``, built from ``collector/_hotpath.c`` at install), if usable.

``active()`` (also readable as ``native.hotpath``) is the module, or None when it was not built
(no C compiler at install), when ``BUBBLESCOPE_PURE_PYTHON`` asks for the Python wrappers, or
when its clock does not agree with the recorder's (``clock.local_ns``): the C wrappers read
``CLOCK_MONOTONIC``, which is ``time.perf_counter_ns`` on Linux; elsewhere it may not be, and the
spans of both would not line up. Either way the collector records the same spans; the Python
wrappers cost more per action.

The choice is made once per process, on first use (when a schedule is instrumented), not at
import: the wrappers get the chosen module when they are built, so no call pays for it.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from bubblescope.collector.clock import local_ns
from bubblescope.collector.config import env_setting

_decided = False
_chosen: ModuleType | None = None


def _clock_agrees(module: ModuleType, reads: int = 5) -> bool:
    """Each C reading falls between two readings of ``local_ns``."""
    for _ in range(reads):
        before, native, after = local_ns(), module.now_ns(), local_ns()
        if not before <= native <= after:
            return False
    return True


def load() -> ModuleType | None:
    """The usable C module now (reads ``BUBBLESCOPE_PURE_PYTHON``); see ``active`` for the cached choice."""
    if env_setting("pure_python"):
        return None
    try:
        _hotpath = importlib.import_module("bubblescope.collector._hotpath")  # a C extension, built at install
    except ImportError:
        return None
    return _hotpath if _clock_agrees(_hotpath) else None


def active() -> ModuleType | None:
    """The C hot path this process uses (None: the Python wrappers), chosen on the first call."""
    global _chosen, _decided
    if not _decided:
        _chosen, _decided = load(), True
    return _chosen


def __getattr__(name: str) -> Any:
    """``native.hotpath``: ``active()`` as an attribute, decided when first read."""
    if name == "hotpath":
        return active()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
