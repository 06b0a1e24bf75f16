"""Which thread makes the calls that can hold a thread up: network I/O, spool writes, sleeps, waits.

A test job installs the probe before ``collector.init`` and opens a window around its training
loop. The probe counts, per kind of call, those the training thread made on the collector's
behalf (a frame of ``bubblescope.collector`` on its stack) inside the window, and those every
other thread made from installation on (the shipper's I/O for the loop's steps may come after
the loop, at shutdown).
The collector's promise that a slow or broken service never holds the training loop up reads,
behaviourally: inside the loop, the training thread makes none of these calls (zero), while the
shipper thread makes them (the probe saw the I/O happen). Unlike a step's wall time, these
counts do not depend on the machine's load.

Probed: ``socket.socket`` connect / send / sendall / recv / recv_into (every HTTP request the
collector makes goes through them), ``os.replace`` (a spool file's commit), ``time.sleep`` and
``threading.Event.wait`` (retry pauses, backoff, waiting for a thread).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

COLLECTOR = "bubblescope.collector"


class IoProbe:
    def __init__(self) -> None:
        self.training_thread = threading.get_ident()
        self.on_training_thread: Counter[str] = Counter()
        self.elsewhere: Counter[str] = Counter()
        self.open = False
        self._lock = threading.Lock()

    def install(self) -> IoProbe:
        for name in ("connect", "send", "sendall", "recv", "recv_into"):
            setattr(socket.socket, name, self._wrap(f"socket.{name}", getattr(socket.socket, name)))
        os.replace = self._wrap("os.replace", os.replace)  # type: ignore[assignment]
        time.sleep = self._wrap("time.sleep", time.sleep)  # type: ignore[assignment]
        threading.Event.wait = self._wrap("Event.wait", threading.Event.wait)  # type: ignore[method-assign]
        return self

    def _wrap(self, kind: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def probed(*args: Any, **kwargs: Any) -> Any:
            self._count(kind)
            return original(*args, **kwargs)

        return probed

    def _count(self, kind: str) -> None:
        if threading.get_ident() != self.training_thread:
            with self._lock:
                self.elsewhere[kind] += 1
            return
        if not self.open:
            return
        frame = sys._getframe(2)
        while frame is not None:
            if str(frame.f_globals.get("__name__", "")).startswith(COLLECTOR):
                self.on_training_thread[kind] += 1
                return
            frame = frame.f_back

    def report(self) -> dict[str, dict[str, int]]:
        return {"on_training_thread": dict(self.on_training_thread), "elsewhere": dict(self.elsewhere)}
