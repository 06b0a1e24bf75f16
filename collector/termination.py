"""SIGTERM: tell the service this rank was terminated, then die as SIGTERM would have made it.

When one rank dies (SIGKILL, the out-of-memory killer), torchrun sends SIGTERM to the others. By
default they die at once and report nothing, so the service could not tell the killed rank from
the terminated ones. With this handler each terminated rank reports a failed end whose error says
it was terminated; the one rank that reported nothing is then the culprit (analysis.alert_rules).

Installed only from the main thread and only where SIGTERM still has its default action (a job's
own handler is left alone). The handler runs on the main thread, between bytecodes: it reports
(bounded by ``REPORT_S``), restores the default action and re-raises SIGTERM. A main thread blocked
in a C call (a collective that never completes) runs no Python handler, so a watcher thread reads
the signal from ``signal.set_wakeup_fd`` (when the job set none of its own) and, if the handler has
not started within ``GRACE_S``, reports and ends the process itself (exit status 143, 128 +
SIGTERM): termination is never slower than ``GRACE_S + REPORT_S`` because of the collector.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

log = logging.getLogger("bubblescope.collector")

TERMINATED = "SIGTERM: terminated (by the launcher after another rank ended, or by the job's scheduler)"
GRACE_S = 1.0
REPORT_S = 2.0
EXIT_STATUS = 128 + signal.SIGTERM

_installed = False


def install(report: Callable[[float], None], reporting: Callable[[], bool]) -> bool:
    """Report SIGTERM with ``report(timeout_s)`` before dying of it; False when not installed.

    ``reporting()`` True: the rank is already reporting its end (the handler interrupted the exit's
    own shutdown, on the same thread): the handler returns, so that report completes, and the
    process exits right after it, as it was about to."""
    global _installed
    if _installed:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return False
    started = threading.Event()

    def on_main_thread(signum: int, _frame: FrameType | None) -> None:
        if reporting():
            started.set()
            return
        if not started.is_set():
            started.set()
            _report_quietly(report)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_main_thread)
    _watch_wakeup_fd(report, started)
    _installed = True
    return True


def _report_quietly(report: Callable[[float], None]) -> None:
    try:
        report(REPORT_S)
    except Exception as error:  # noqa: BLE001 - dying must not fail
        log.warning("bubblescope: could not report the termination: %r", error)


def _watch_wakeup_fd(report: Callable[[float], None], started: threading.Event) -> None:
    """The fallback for a main thread that runs no Python code (see the module's docstring)."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    if previous != -1:  # the job (or a library) reads signals this way itself: leave it alone
        signal.set_wakeup_fd(previous)
        os.close(read_end)
        os.close(write_end)
        return

    def watch() -> None:
        while True:
            try:
                received = os.read(read_end, 64)
            except OSError:
                return
            if signal.SIGTERM in received and not started.wait(GRACE_S):
                started.set()
                _report_quietly(report)
                os._exit(EXIT_STATUS)

    threading.Thread(target=watch, name="bubblescope-sigterm", daemon=True).start()
