"""On-disk spool for messages the service could not take yet.

One file per message, written atomically (temporary file, then rename), named so that a
lexical sort is the sending order. A process killed mid-write leaves at most a ``*.tmp`` file,
which is never read as a message (and ``upload-spool`` deletes it once it is stale). The first
line of a file is the method and path, the rest is the gzip body exactly as it would have been
sent, so nothing is re-encoded on upload.

Bounded in bytes: past the bound new messages are refused (the caller counts their spans as
dropped). One small file outside the bound, ``COUNTERS_NAME``, holds the newest drop counter so
the service learns about the loss even when the spool is full; it sorts after every message.
A file that cannot be parsed is renamed ``*.bad`` so it never blocks the messages behind it. A message the
service refused for good (a 4xx that no retry changes: a field an older service does not know, say) is kept as
``*.rejected`` beside the pending ones, at most ``MAX_REJECTED`` of them and within the byte bound: never sent
again, but not lost.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from pathlib import Path

from bubblescope.collector.transport import Message

_SUFFIX = ".msg"
_TEMPORARY = ".tmp"
COUNTERS_NAME = "zz-counters" + _SUFFIX
REJECTED_SUFFIX = ".rejected"
MAX_REJECTED = 64
_counter = itertools.count()


class Spool:
    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self._bytes: int | None = None
        self.unreadable = 0  # files moved aside as *.bad by this instance

    def _size(self) -> int:
        if self._bytes is None:
            total = 0
            for path in self.files():
                try:
                    total += path.stat().st_size
                except OSError:
                    pass
            self._bytes = total
        return self._bytes

    def write(self, message: Message) -> bool:
        """Store a message; False (nothing written) when the spool is full or the disk fails."""
        data = _encode(message)
        size = len(data)
        if self._size() + size > self.max_bytes:
            return False
        name = f"{time.time_ns():020d}-{os.getpid()}-{next(_counter):08d}{_SUFFIX}"
        if not self._write_atomically(name, data):
            return False
        self._bytes = self._size() + size
        return True

    def keep_rejected(self, message: Message) -> bool:
        """Keep a refused message for a person (``*.rejected``, not pending); False past ``MAX_REJECTED`` files, past
        the spool's byte bound (pending and refused together), or on a disk error."""
        data = _encode(message)
        kept = list(self.directory.glob(f"*{REJECTED_SUFFIX}")) if self.directory.exists() else []
        try:
            kept_bytes = sum(path.stat().st_size for path in kept)
        except OSError:
            return False
        if len(kept) >= MAX_REJECTED or self._size() + kept_bytes + len(data) > self.max_bytes:
            return False
        name = f"{time.time_ns():020d}-{os.getpid()}-{next(_counter):08d}{_SUFFIX}{REJECTED_SUFFIX}"
        return self._write_atomically(name, data)

    def write_counters(self, message: Message) -> bool:
        """Replace the one counters message (outside the bound: it is a few hundred bytes)."""
        written = self._write_atomically(COUNTERS_NAME, _encode(message))
        self._bytes = None
        return written

    def _write_atomically(self, name: str, data: bytes) -> bool:
        temporary = self.directory / f"{name}.{os.getpid()}{_TEMPORARY}"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(temporary, "wb") as handle:
                handle.write(data)
            os.replace(temporary, self.directory / name)
        except OSError:
            try:
                temporary.unlink()
            except OSError:
                pass
            return False
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
            except FileNotFoundError:
                continue  # sent and removed by another uploader meanwhile
            except (OSError, ValueError):
                self._quarantine(path)
                continue
            yield path, Message(method, request_path, body)

    def _quarantine(self, path: Path) -> None:
        """Move an unparsable file aside (``*.bad``): kept for a human, no longer pending."""
        try:
            os.replace(path, path.with_name(path.name + ".bad"))
            self.unreadable += 1
        except OSError:
            pass
        self._bytes = None

    def remove(self, path: Path) -> None:
        try:
            before = self._size()
            size = path.stat().st_size
            path.unlink()
            self._bytes = max(0, before - size)
        except OSError:
            self._bytes = None

    def remove_stale_temporaries(self, older_than_s: float) -> int:
        """Delete ``*.tmp`` files left by killed writers; returns how many were removed."""
        if not self.directory.exists():
            return 0
        cutoff = time.time() - older_than_s
        removed = 0
        for path in self.directory.rglob(f"*{_TEMPORARY}"):
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
            except OSError:
                pass
        return removed


def _encode(message: Message) -> bytes:
    return f"{message.method} {message.path}\n".encode() + message.body
