"""Backpressure: at most ``ingest_in_flight`` ingest requests at once; the next is told to retry.

A request waits for nothing here: when the service is behind, a sender learns it at once (503 with
``Retry-After``) and keeps its batch (the collector spools and retries), instead of every request
queueing behind the database and latency growing without bound. Reads never pass this gate, so
they keep worker threads and database connections while ingest is saturated.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from bubblescope.backend.errors import busy


class IngestGate:
    """Counts ingest requests in flight; used on the event loop only, so it needs no lock."""

    def __init__(self, limit: int, retry_after_s: int) -> None:
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.in_flight = 0

    @contextmanager
    def admit(self) -> Iterator[None]:
        if self.in_flight >= self.limit:
            raise busy(f"{self.in_flight} ingest requests in flight (the limit)", self.retry_after_s)
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
