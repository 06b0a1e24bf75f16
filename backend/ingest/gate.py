"""Backpressure: at most ``ingest_in_flight`` ingest requests are worked on at once, up to
``ingest_queue`` more wait their turn, and the next is told to retry.

A request is admitted once its body has arrived (the ingest route reads it first): a sender dribbling its
body costs one connection and its bytes (``body.BodyBudget``, ``--body-timeout``), never a slot, so slow
uploads cannot keep everyone else's batches waiting or refused. A full gate still refuses before the body is
read (``refuse_if_full``).

Few at once: the work is Python holding the GIL between database round trips, so more threads add
switching, not throughput (measured in docs/scale.md: 64 at once did 56 batches/s where 4 at once
did 95). A short queue absorbs the bursts of a big job's ranks; past it a sender learns at once
(503 with ``Retry-After``) and keeps its batch (the collector spools and retries), instead of every
request queueing behind the database and latency growing without bound. Reads never pass this gate,
so they keep worker threads and database connections while ingest is saturated.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from bubblescope.backend.errors import busy


class IngestGate:
    """Counts ingest requests admitted; used on the event loop only, so the count needs no lock."""

    def __init__(self, limit: int, queue: int, retry_after_s: int, what: str = "ingest requests") -> None:
        self.what = what  # what is admitted, as the 503 says it
        self.limit = limit
        self.queue = queue
        self.retry_after_s = retry_after_s
        self.admitted = 0
        self._turns: asyncio.Semaphore | None = None  # made on the serving loop, at first use

    def refuse_if_full(self) -> None:
        """503 now, before a body is read, when ``admit`` would refuse it: a sender learns at once under load."""
        if self.admitted >= self.limit + self.queue:
            raise busy(f"{self.limit} {self.what} in work and {self.queue} waiting (the limits)", self.retry_after_s)

    @asynccontextmanager
    async def admit(self) -> AsyncIterator[None]:
        self.refuse_if_full()
        if self._turns is None:
            self._turns = asyncio.Semaphore(self.limit)
        self.admitted += 1
        try:
            async with self._turns:
                yield
        finally:
            self.admitted -= 1
