"""On-disk spool for messages the service could not take yet.

One file per message, written atomically (temporary file, then rename), named so that a
lexical sort is the sending order. The first line of a file is the method and path, the rest
is the gzip body exactly as it would have been sent, so nothing is re-encoded on upload.
Bounded in bytes: past the bound new messages are refused (the caller counts them dropped).
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from pathlib import Path

from bubblescope.collector.transport import Message

_SUFFIX = ".msg"
_counter = itertools.count()


class Spool:
    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self._bytes: int | None = None

    def _size(self) -> int:
        if self._bytes is None:
            self._bytes = sum(path.stat().st_size for path in self.files())
        return self._bytes

    def write(self, message: Message) -> bool:
        """Store a message; False (nothing written) when the spool is full or the disk fails."""
        header = f"{message.method} {message.path}\n".encode()
        size = len(header) + len(message.body)
        try:
            if self._size() + size > self.max_bytes:
                return False
            self.directory.mkdir(parents=True, exist_ok=True)
            name = f"{time.time_ns():020d}-{os.getpid()}-{next(_counter):08d}{_SUFFIX}"
            temporary = self.directory / (name + ".tmp")
            with open(temporary, "wb") as handle:
                handle.write(header + message.body)
            os.replace(temporary, self.directory / name)
        except OSError:
            return False
        self._bytes = self._size() + size
        return True

    def files(self) -> list[Path]:
        """Spooled message files, oldest first, across every run and rank below the directory."""
        if not self.directory.exists():
            return []
        return sorted(self.directory.rglob(f"*{_SUFFIX}"), key=lambda path: path.name)

    def has_pending(self) -> bool:
        return self._size() > 0

    def pending(self) -> Iterator[tuple[Path, Message]]:
        for path in self.files():
            try:
                raw = path.read_bytes()
                header, body = raw.split(b"\n", 1)
                method, request_path = header.decode().split(" ", 1)
            except (OSError, ValueError):
                continue  # unreadable or partial: left for a human, never crashes the job
            yield path, Message(method, request_path, body)

    def remove(self, path: Path) -> None:
        try:
            size = path.stat().st_size
            path.unlink()
            self._bytes = max(0, self._size() - size)
        except OSError:
            self._bytes = None
