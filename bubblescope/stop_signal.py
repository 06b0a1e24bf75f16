"""SIGTERM as an exit for the commands that read traces (``import-trace``, ``trace-summary``): a scheduler's or a
container's stop unwinds the command, so the temporary files a trace is read into are removed on the way out, as
after an error, not left in TMPDIR; the command exits 143.

The handler raises ``SystemExit`` wherever the main thread is, and Python ignores an exception raised inside a
garbage collector's callback (SQLAlchemy registers some): that exit is lost. So the handler also records the
signal, the readers ``check`` it at safe points, and ``main`` answers 143 whatever the command returned.

A temporary folder is made and registered for removal inside ``deferred``: a SIGTERM between the two (the folder on
disk, its name not yet kept) would leave it behind, so there the signal is recorded and the exit raised at the end.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

EXIT: Final = 128 + signal.SIGTERM
_requested = False
_deferring = 0  # depth of ``deferred`` blocks in the main thread, where the handler runs


def install() -> None:
    signal.signal(signal.SIGTERM, _stop)


def _stop(_signal: int, _frame: object) -> None:
    global _requested
    _requested = True
    if not _deferring:
        raise SystemExit(EXIT)


def requested() -> bool:
    return _requested


def check() -> None:
    """Exit (143) if SIGTERM came, at a point where an exception is not lost."""
    if _requested:
        raise SystemExit(EXIT)


@contextmanager
def deferred() -> Iterator[None]:
    """A block SIGTERM does not interrupt: a signal that comes during it exits (143) at its end."""
    global _deferring
    if threading.current_thread() is not threading.main_thread():  # the handler never interrupts another thread
        yield
        return
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
    check()
