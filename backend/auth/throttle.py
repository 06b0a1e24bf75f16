"""Failed token attempts, slowed per client.

A token the service does not know costs a database lookup, and guessing tokens is a loop of them: the probe
measured 112 guesses a second, each a query, counted and never slowed. A client (its address as uvicorn sees it)
that sends ``--unknown-tokens-per-minute`` (20) unknown tokens within ``WINDOW_S`` seconds is answered 429 with
``Retry-After`` until the oldest of those failures is ``WINDOW_S`` old, without a lookup; a token the service has
already seen valid still passes, so a team's collectors behind the same address as a guesser keep working.
At most ``MAX_CLIENTS`` clients are remembered, the least recent forgotten first (memory bounded).
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Final

WINDOW_S: Final = 60.0
MAX_CLIENTS: Final = 10_000


class FailedAttempts:
    def __init__(self, max_failures: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_failures = max_failures
        self.clock = clock
        self._lock = threading.Lock()
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def wait_s(self, client: str) -> int:
        """Seconds ``client`` must wait before its next attempt is looked at; 0: now."""
        now = self.clock()
        with self._lock:
            failures = self._failures.get(client)
            if failures is None or len(failures) < self.max_failures:
                return 0
            remaining = failures[0] + WINDOW_S - now
        return max(0, math.ceil(remaining))

    def forgive(self, client: str) -> None:
        """The newest attempt counted for ``client`` was a valid token after all (``guard.checked_token``)."""
        with self._lock:
            failures = self._failures.get(client)
            if failures:
                failures.pop()

    def failed(self, client: str) -> None:
        now = self.clock()
        with self._lock:
            failures = self._failures.pop(client, None) or deque(maxlen=self.max_failures)
            failures.append(now)
            self._failures[client] = failures  # the most recent last
            while len(self._failures) > MAX_CLIENTS:
                self._failures.popitem(last=False)
