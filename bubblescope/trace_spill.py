"""A trace's events on disk while it is imported (``trace_import``), so that an import holds one step at a time,
not the file: a profiler writes its events in no time order (CPU operators, runtime calls and kernels
interleaved), so a step's events are only all known at the file's end.

Rows go to a temporary SQLite file as they are read, are indexed once the file is read, and are read back a
step's time window at a time; the converted steps' batches go to the same file and are read back one at a time
as they are sent (``SpilledBatches``). The folder is removed when the last object that reads it is gone.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from bubblescope import stop_signal

ROWS_PER_WRITE: Final = 20_000
BUCKET_SHIFT: Final = 16  # intervals bucketed by length: under 65 µs, then each bucket twice as long
CACHE_KIB: Final = 16_384  # SQLite's page cache per connection: the store's memory, whatever the file's size
OPTIMIZER, COMM_OP, DATA_LOADING, PIPELINE_ACTION = 1, 2, 3, 4  # sorts of CPU interval

_TABLES: Final = (
    "CREATE TABLE gpu (start INTEGER, end_ INTEGER, name TEXT, category TEXT, correlation INTEGER, "
    "collective TEXT, group_name TEXT, group_ranks TEXT, peer INTEGER, group_peer INTEGER)",
    "CREATE TABLE launches (correlation INTEGER PRIMARY KEY, start INTEGER, tid INTEGER)",
    "CREATE TABLE intervals (sort INTEGER, bucket INTEGER, start INTEGER, end_ INTEGER, tid INTEGER, "
    "collective TEXT, group_name TEXT, group_ranks TEXT, peer INTEGER, group_peer INTEGER)",
    "CREATE TABLE cpu_ops (start INTEGER, end_ INTEGER, tid INTEGER, backward INTEGER)",
    "CREATE TABLE batches (seq INTEGER PRIMARY KEY, document TEXT)",
)
_INSERTS: Final = {
    "gpu": "INSERT INTO gpu VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "launches": "INSERT OR IGNORE INTO launches VALUES (?, ?, ?)",  # a correlation's first runtime call
    "intervals": "INSERT INTO intervals VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "cpu_ops": "INSERT INTO cpu_ops VALUES (?, ?, ?, ?)",
}
_INDEXES: Final = (
    "CREATE INDEX gpu_by_correlation ON gpu (correlation)",
    "CREATE INDEX launches_by_start ON launches (start)",
    "CREATE INDEX intervals_by_start ON intervals (sort, bucket, start)",
    "CREATE INDEX cpu_ops_by_start ON cpu_ops (start)",
)


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path)
    for pragma in ("journal_mode = OFF", "synchronous = OFF", f"cache_size = -{CACHE_KIB}", "temp_store = FILE"):
        db.execute(f"PRAGMA {pragma}")
    return db


class TraceStore:
    """One file's events as rows: GPU activities, runtime launches, CPU intervals (optimizer steps, communication
    calls) and CPU operators. ``add_*`` while reading, ``finish`` once, then the range queries."""

    def __init__(self) -> None:
        with stop_signal.deferred():  # a SIGTERM between the two would leave the folder behind
            self.folder = Path(tempfile.mkdtemp(prefix="bubblescope-trace-"))
            self._removal = weakref.finalize(self, shutil.rmtree, self.folder, True)
        self.db = _connect(self.folder / "events.sqlite")
        for table in _TABLES:
            self.db.execute(table)
        self._pending: dict[str, list[tuple[Any, ...]]] = {table: [] for table in _INSERTS}
        self._buckets: dict[int, set[int]] = {
            sort: set() for sort in (OPTIMIZER, COMM_OP, DATA_LOADING, PIPELINE_ACTION)
        }  # of each sort, the buckets used
        self.counts = dict.fromkeys(_INSERTS, 0)

    def add(self, table: str, row: tuple[Any, ...]) -> None:
        pending = self._pending[table]
        pending.append(row)
        self.counts[table] += 1
        if len(pending) >= ROWS_PER_WRITE:
            self._write(table)

    def add_interval(self, sort: int, start: int, end: int, tid: int, info: tuple[Any, ...]) -> None:
        bucket = max(0, (end - start).bit_length() - BUCKET_SHIFT)  # intervals under 2**(bucket + shift) ns long
        self._buckets[sort].add(bucket)
        self.add("intervals", (sort, bucket, start, end, tid, *info))

    def _write(self, table: str) -> None:
        self.db.executemany(_INSERTS[table], self._pending[table])
        self._pending[table].clear()

    def discard(self) -> None:
        """The folder removed now (a refused or failed import), not when the last reader goes."""
        self.db.close()
        self._removal()

    def finish(self) -> None:
        for table in _INSERTS:
            self._write(table)
        for index in _INDEXES:
            self.db.execute(index)
        self.db.commit()

    def gpu_launched(self, lo: int, hi: int) -> Iterator[tuple[Any, ...]]:
        """(start, end, name, category, collective, group name, group ranks, peer, group peer, launch, tid) of each
        GPU activity launched at ``lo`` <= t < ``hi``, by start."""
        return iter(
            self.db.execute(
                "SELECT g.start, g.end_, g.name, g.category, g.collective, g.group_name, g.group_ranks, g.peer, "
                "g.group_peer, l.start, l.tid FROM launches AS l JOIN gpu AS g ON g.correlation = l.correlation "
                "WHERE l.start >= ? AND l.start < ? ORDER BY g.start",
                (lo, hi),
            )
        )

    def intervals(self, sort: int, lo: int, hi: int) -> list[tuple[Any, ...]]:
        """(start, end, tid, collective, group name, group ranks, peer, group peer) of each interval of ``sort``
        that overlaps ``lo``..``hi``, by start (then the longer first). Each length bucket is looked up as far back
        as its intervals last: one long interval does not make every step scan the file's earlier ones."""
        found: list[tuple[Any, ...]] = []
        for bucket in sorted(self._buckets[sort]):
            reach = 1 << (bucket + BUCKET_SHIFT)
            found += self.db.execute(
                "SELECT start, end_, tid, collective, group_name, group_ranks, peer, group_peer FROM intervals "
                "WHERE sort = ? AND bucket = ? AND start >= ? AND start <= ? AND end_ >= ?",
                (sort, bucket, lo - reach, hi, lo),
            ).fetchall()
        return sorted(found, key=lambda row: (row[0], -row[1]))

    def cpu_ops(self, lo: int, hi: int) -> Iterator[tuple[int, int, int, int]]:
        """(start, end, tid, in backward) of each CPU operator starting at ``lo`` <= t < ``hi``, parents first."""
        return iter(
            self.db.execute(
                "SELECT start, end_, tid, backward FROM cpu_ops WHERE start >= ? AND start < ? "
                "ORDER BY start, end_ DESC",
                (lo, hi),
            )
        )

    def batches(self, documents: Iterator[dict[str, Any]]) -> SpilledBatches:
        """``documents`` (each step's batches, in order) written to the file: what is sent, read back one by one."""
        count = 0
        rows: list[tuple[int, str]] = []
        for document in documents:
            rows.append((count, json.dumps(document, separators=(",", ":"))))
            count += 1
            if len(rows) >= 256:
                self.db.executemany("INSERT INTO batches VALUES (?, ?)", rows)
                rows.clear()
        self.db.executemany("INSERT INTO batches VALUES (?, ?)", rows)
        self.db.commit()
        self.db.close()
        return SpilledBatches(self.folder / "events.sqlite", count, self)


class SpilledBatches:
    """A converted file's batches, read from disk one at a time; iterable more than once."""

    def __init__(self, path: Path, count: int, store: TraceStore) -> None:
        self.path = path
        self.count = count
        self._store = store  # the folder is removed with the store: it lives as long as this does

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[dict[str, Any]]:
        db = _connect(self.path)
        try:
            for (document,) in db.execute("SELECT document FROM batches ORDER BY seq"):
                yield json.loads(document)
        finally:
            db.close()
