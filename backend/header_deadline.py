"""A request's headers within ``--header-timeout`` seconds, or the connection is closed.

uvicorn has no such timeout: a client that sends a request's headers a byte at a time holds its connection for
as long as it likes (the keep-alive timer runs only between requests, and is stopped by any byte). This is
uvicorn's own HTTP/1.1 protocol (h11) with one timer added: armed when a connection opens and when the first
byte of a next request arrives, stopped once the request's headers are complete; if it fires while the headers
are still incomplete, the connection is closed. The body has its own bound (``--body-timeout``, ``body.py``).
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


class HeaderDeadline(H11Protocol):
    timeout_s: ClassVar[float] = 10.0  # set per server (``with_timeout``)
    header_timer: asyncio.TimerHandle | None = None

    @classmethod
    def with_timeout(cls, timeout_s: float) -> type[HeaderDeadline]:
        return type("HeaderDeadline", (cls,), {"timeout_s": timeout_s})

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.header_timer is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the first bytes of a next request on a kept-alive connection
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm()  # the headers are in (h11 leaves IDLE once it has parsed the whole request line and headers)
        elif self.header_timer is None and self.conn.trailing_data[0]:
            self._arm()  # a next request's first bytes came with the end of the last one: its headers have a deadline

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self.header_timer = self.loop.call_later(self.timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _headers_late(self) -> None:
        self.header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()
