"""Reading a torch.profiler (Kineto) trace as a stream: the file's top-level fields, then its events one by one.

A Kineto trace is one JSON object: metadata fields (``distributedInfo`` with the rank, ``deviceProperties``,
``baseTimeNanoseconds`` ...) and ``traceEvents``, a list that holds nearly all of the file. ``read_trace``
decodes it in chunks, plain or gzip, and hands each event to the caller as it is decoded (the C scanner of
``json``, one value at a time), so memory holds a chunk and what the caller keeps, never the whole list.
Metadata fields before ``traceEvents`` (where Kineto writes ``distributedInfo``) are known before the first
event; those after it once the events are done.

Bad input is a ``TraceError`` naming the file and the problem: not JSON, a truncated gzip or document, no
``traceEvents``.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import re
import shutil
import sqlite3
import tempfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final, NamedTuple, TypeGuard

from bubblescope import stop_signal
from bubblescope.analysis import GpuActivity

CHUNK_CHARS: Final = 1 << 20
_DECODER = json.JSONDecoder()
_NOT_WHITESPACE = re.compile(r"[^ \t\n\r]")
_SEPARATOR = re.compile(r"[ \t\n\r]*([,\]])[ \t\n\r]*")  # after an event: the comma or the list's end


class TraceError(ValueError):
    """A trace that cannot be read; the message names the file and what is wrong."""


def _open_text(path: Path) -> IO[str]:
    raw = path.open("rb")
    magic = raw.read(2)
    raw.seek(0)
    binary: IO[bytes] = gzip.GzipFile(fileobj=raw) if magic == b"\x1f\x8b" else raw  # type: ignore[assignment]
    return io.TextIOWrapper(binary, encoding="utf-8", errors="strict")


class _Buffer:
    """Decoded text with a read position, refilled from the file as values are taken."""

    def __init__(self, stream: IO[str], where: str) -> None:
        self.stream, self.where = stream, where
        self.text, self.pos, self.done = "", 0, False
        self.whole_events = True  # the fast path (``_decode_whole_events``), until it fails on this file
        self.cut_misses = 0  # chunks where it found no cut: past ``CUT_MISSES`` the file is read one by one

    def _refill(self) -> bool:
        if self.done:
            return False
        stop_signal.check()  # once a chunk, on every path: a SIGTERM whose exit was lost ends the read here
        try:
            chunk = self.stream.read(CHUNK_CHARS)
        except (EOFError, OSError, UnicodeDecodeError, zlib.error) as error:  # a truncated or corrupt gzip, bad UTF-8
            raise TraceError(f"{self.where}: cannot be read to its end ({error})") from None
        if not chunk:
            self.done = True
            return False
        self.text = self.text[self.pos :] + chunk
        self.pos = 0
        return True

    def peek(self) -> str:
        """The next character that is not whitespace ('' at the end of the file)."""
        while True:
            found = _NOT_WHITESPACE.search(self.text, self.pos)
            if found is not None:
                self.pos = found.start()
                return self.text[self.pos]
            self.pos = len(self.text)
            if not self._refill():
                return ""

    def expect(self, char: str) -> None:
        found = self.peek()
        if found != char:
            raise TraceError(f"{self.where}: expected {char!r} at offset {self.pos}, found {found or 'the end'!r}")
        self.pos += 1

    def value(self) -> Any:
        """The next JSON value, refilling until it is whole."""
        self.peek()
        while True:
            try:
                value, end = _DECODER.raw_decode(self.text, self.pos)
            except json.JSONDecodeError as error:
                if self._refill():  # a value cut at the chunk's end: read on
                    continue
                raise TraceError(
                    f"{self.where}: not a whole JSON trace ({error.msg}, near the file's end or a bad value)"
                ) from None
            if end == len(self.text) and not self.done and isinstance(value, (int, float)):
                self._refill()  # a number at the chunk's end may go on in the next chunk
                continue
            self.pos = end
            return value


EventSink = Callable[[dict[str, Any]], None]


def read_trace(
    path: Path, on_event: EventSink, on_metadata: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """Stream ``path``'s events into ``on_event`` in file order; ``on_metadata`` gets the top-level fields read so
    far when the events start. Returns every top-level field but the events."""
    metadata: dict[str, Any] = {}
    saw_events = False
    with _open_text(path) as stream:
        buffer = _Buffer(stream, str(path))
        buffer.expect("{")
        while buffer.peek() != "}":
            if buffer.peek() == "":
                raise TraceError(f"{path}: the document ends before its closing brace")
            key = buffer.value()
            buffer.expect(":")
            if key == "traceEvents":
                saw_events = True
                if on_metadata is not None:
                    on_metadata(metadata)
                try:
                    _stream_events(buffer, on_event)
                except TraceError as error:  # the sink's refusal of an event: named with the file
                    if str(error).startswith(str(path)):
                        raise
                    raise TraceError(f"{path}: {error}") from None
            else:
                metadata[str(key)] = buffer.value()
            if buffer.peek() == ",":
                buffer.pos += 1
        buffer.expect("}")
    if not saw_events:
        raise TraceError(f"{path}: no traceEvents: not a torch.profiler trace")
    return metadata


def _stream_events(buffer: _Buffer, on_event: EventSink) -> None:
    """The list's events into ``on_event``. The fast path decodes every whole event of the decoded text in one call
    (cut after the last ``}, {"ph"``: Kineto writes ``ph`` first); the slow path takes one event at a time with the C
    scanner, refilling where an event or the separator after it runs past the decoded text, and is also where a
    document the fast path cannot cut or decode is read (a bad one then gets its message from it)."""
    buffer.expect("[")
    if buffer.peek() == "]":
        buffer.pos += 1
        return
    scan, separator = _DECODER.scan_once, _SEPARATOR  # type: ignore[attr-defined]
    while True:
        if buffer.whole_events and len(buffer.text) - buffer.pos > BATCH_MIN_CHARS:
            decoded = _decode_whole_events(buffer, on_event)
            buffer.cut_misses += decoded is None
            buffer.whole_events = decoded is not False and buffer.cut_misses < CUT_MISSES
        text, pos = buffer.text, buffer.pos
        try:
            event, pos = scan(text, pos)
            found = separator.match(text, pos)
        except (StopIteration, json.JSONDecodeError):
            found = None
        if found is None or found.end() == len(text):  # cut at the chunk's end, or a bad document: go slowly
            event = buffer.value()
            following = buffer.peek()
            buffer.pos += 1
        else:
            following = found.group(1)
            buffer.pos = found.end()
        if isinstance(event, dict):
            on_event(event)
        if following == "]":
            return
        if following != ",":
            raise TraceError(f"{buffer.where}: expected ',' or ']' between events, found {following or 'the end'!r}")


BATCH_MIN_CHARS: Final = 1 << 16
CUT_TRIES: Final = 16
CUT_MISSES: Final = 64


def _stdlib_decode(text: str) -> Any:
    return _DECODER.decode(text)


_decode_list: Callable[[str], Any] = _stdlib_decode
try:  # orjson (an optional dependency, in the server's extras) decodes a chunk of events about twice as fast
    from orjson import loads as _decode_list
except ImportError:  # pragma: no cover - the standard library's decoder does the same, slower
    pass
_BEFORE_EVENT = re.compile(r"\}[ \t\n\r]*,[ \t\n\r]*\{[ \t\n\r]*$")


def _decode_whole_events(buffer: _Buffer, on_event: EventSink) -> bool | None:
    """Every whole event from the buffer's position to the last event start in its text, decoded as one JSON list;
    the position moves past them (True). With the buffer as it was: None where no cut is found among the last few
    ``"ph"`` keys (a block of events written otherwise), False where the piece does not decode (the file is then
    read one event at a time)."""
    text, pos = buffer.text, buffer.pos
    start = text.rfind('"ph"', pos)
    for _ in range(CUT_TRIES):
        if start <= pos:
            break
        window = max(pos, start - 64)
        before = _BEFORE_EVENT.search(text, window, start)
        if before is not None:
            cut = before.start() + 1  # just past the '}' that ends the last whole event
            try:
                events = _decode_list("[" + text[pos:cut] + "]")
            except ValueError:  # json's and orjson's decode errors both are
                return False
            for event in events:
                if isinstance(event, dict):
                    on_event(event)
            buffer.pos = text.index(",", cut) + 1
            return True
        start = text.rfind('"ph"', pos, start)
    return None


@dataclass
class RankTrace:
    """What one rank's trace holds for the trace figures: its GPU activities, selected and rounded as Holistic
    Trace Analysis 0.5.0 selects them (``select_activities``), and where it came from."""

    path: Path
    rank: int | None
    world_size: int | None
    activities: list[GpuActivity]
    profiler_steps: list[str]
    events: int
    metadata: dict[str, Any] = field(default_factory=dict)


GpuRow = tuple[Any, Any, str, str, int, int, "str | None"]  # ts, dur, name, category, stream, correlation, collective


class P2pKernel(NamedTuple):
    """An NCCL send or recv kernel, in the trace's time unit, with the global rank it sends to or receives from."""

    start: Any
    end: Any
    direction: str  # "send" or "recv"
    peer: int


@dataclass
class _Collected:
    """What the figures need of a trace: its GPU activities, the runtime calls' starts, its profiler steps. Held in
    lists here; ``_SpilledCollected`` keeps the first two on disk."""

    gpu: list[GpuRow] = field(default_factory=list)
    launches: dict[int, Any] = field(default_factory=dict)  # correlation id -> runtime call's start
    steps: list[tuple[str, Any]] = field(default_factory=list)  # ProfilerStep#N and its start
    p2p: list[P2pKernel] = field(default_factory=list)  # NCCL send/recv kernels naming their peer (few)
    events: int = 0
    fractional: bool = False  # a start that is not an integer (or none): HTA then rounds every time

    def add(self, event: dict[str, Any]) -> None:
        self.events += 1
        ts = event.get("ts")
        if not isinstance(ts, int):
            self.fractional = True
        duration, category = event.get("dur"), event.get("cat")
        if category is None or category == "Trace" or not (_number(ts) and _number(duration)):
            return
        if not (_storable(ts) and _storable(duration)):
            raise TraceError(f"an event at ts {ts!r} (dur {duration!r}): a time past what can be stored")
        args = event.get("args")
        args = args if isinstance(args, dict) else {}
        stream, correlation = _integer(args.get("stream")), _integer(args.get("correlation"))
        name = str(event.get("name", ""))
        if stream >= 0 and correlation >= 0:
            collective = args.get("Collective name")
            self._add_gpu(
                (ts, duration, name, str(category), stream, correlation, str(collective) if collective else None)
            )
            if collective in ("send", "recv"):  # torch names a P2P kernel's peer as a global rank
                peer = _integer(args.get("Src Rank" if collective == "recv" else "Dst Rank"))
                if peer >= 0:
                    self.p2p.append(P2pKernel(ts, ts + duration, collective, peer))
            return
        if "ProfilerStep" in name:
            self.steps.append((name, ts))
        if correlation >= 0:
            self._add_launch(correlation, ts)

    def _add_gpu(self, row: GpuRow) -> None:
        self.gpu.append(row)

    def _add_launch(self, correlation: int, ts: Any) -> None:
        self.launches.setdefault(correlation, ts)


INT64: Final = 1 << 63


def _integer(value: Any) -> int:
    """HTA's reading of ``stream`` and ``correlation``: an integer, else -1 (and -1 past what can be stored)."""
    try:
        number = int(value) if value is not None and not isinstance(value, bool) else -1
    except (TypeError, ValueError, OverflowError):
        return -1
    return number if -INT64 <= number < INT64 else -1


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _storable(value: int | float) -> bool:
    """A time SQLite can hold (a trace past 100,000 activities is read back from it): an integer within 64 bits, or
    a finite float."""
    return -INT64 <= value < INT64 if isinstance(value, int) else math.isfinite(value)


@dataclass(frozen=True)
class _Selection:
    """HTA's selection: with fractional times, starts rounded up and ends down (its answer to overlapping events);
    with two or more profiler steps, only activities launched before the last step began (HTA leaves the last,
    often cut, step out)."""

    fractional: bool
    last_step: int | None

    def start_of(self, ts: Any) -> int:
        return math.ceil(ts) if self.fractional else int(ts)

    def end_of(self, ts: Any) -> int:
        return math.floor(ts) if self.fractional else int(ts)

    def activity(self, row: GpuRow, launched: Any) -> GpuActivity | None:
        """The row as HTA keeps it, launched at ``launched`` (its runtime call's start); None where left out."""
        at = self.start_of(launched)
        if self.last_step is not None and at >= self.last_step:
            return None
        ts, duration, name, category, stream, _correlation, collective = row
        return GpuActivity(self.start_of(ts), self.end_of(ts + duration), name, category, stream, at, collective)


def _selection(collected: _Collected) -> tuple[_Selection, list[str]]:
    names = sorted({name for name, _ in collected.steps})
    selection = _Selection(collected.fractional, None)
    if len(names) >= 2:
        selection = _Selection(collected.fractional, max(selection.start_of(ts) for _, ts in collected.steps))
    return selection, names


def select_activities(collected: _Collected) -> tuple[list[GpuActivity], list[str]]:
    """HTA's selection (``_Selection``) of the activities whose runtime call is in the trace."""
    selection, names = _selection(collected)
    activities = [
        activity
        for row in collected.gpu
        if row[5] in collected.launches and (activity := selection.activity(row, collected.launches[row[5]]))
    ]
    return activities, names


_CEILING: Final = "(CAST(g.ts AS INTEGER) + (g.ts > CAST(g.ts AS INTEGER)))"  # ceil(ts) in SQLite, for ts >= 0


class _SpilledCollected(_Collected):
    """The same, held in memory up to ``IN_MEMORY_ROWS`` GPU activities and past that in a temporary SQLite file: read
    back in order of start and of stream, for ``analysis.figures``. Memory is bounded whatever the trace's size (the
    rows held, or SQLite's page cache), and a small trace pays nothing for the file."""

    IN_MEMORY_ROWS: Final = 100_000
    ROWS_PER_WRITE: Final = 20_000

    def __init__(self) -> None:
        super().__init__()
        self.folder: Path | None = None
        self.db: sqlite3.Connection | None = None
        self._launches: list[tuple[int, Any]] = []

    def _add_gpu(self, row: GpuRow) -> None:
        self.gpu.append(row)
        if self.db is None and len(self.gpu) >= self.IN_MEMORY_ROWS:
            self._spill()
        elif self.db is not None and len(self.gpu) >= self.ROWS_PER_WRITE:
            self._flush()

    def _add_launch(self, correlation: int, ts: Any) -> None:
        if self.db is None:
            super()._add_launch(correlation, ts)
            if len(self.launches) >= self.IN_MEMORY_ROWS:  # runtime calls whose kernels the trace lost count too
                self._spill()
            return
        self._launches.append((correlation, ts))
        if len(self._launches) >= self.ROWS_PER_WRITE:
            self._flush()

    def _spill(self) -> None:
        with stop_signal.deferred():  # a SIGTERM before the name is kept would leave the folder behind
            self.folder = Path(tempfile.mkdtemp(prefix="bubblescope-summary-"))
        self.db = sqlite3.connect(self.folder / "events.sqlite")
        self.db.executescript(
            "PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF; PRAGMA cache_size = -16384;"
            "CREATE TABLE gpu (ts, dur, name TEXT, category TEXT, stream INTEGER, correlation INTEGER, collective);"
            "CREATE TABLE launches (correlation INTEGER PRIMARY KEY, ts);"
        )
        self._launches = list(self.launches.items())
        self.launches.clear()
        self._flush()

    def _flush(self) -> None:
        if self.db is None:
            return
        self.db.executemany("INSERT INTO gpu VALUES (?, ?, ?, ?, ?, ?, ?)", self.gpu)
        self.db.executemany("INSERT OR IGNORE INTO launches VALUES (?, ?)", self._launches)  # the first one counts
        self.gpu.clear()
        self._launches.clear()

    def activities(self, order: str) -> Iterator[GpuActivity]:
        """The selected activities by ``start`` or by ``stream`` (then start; ties in the trace's order)."""
        selection, _names = _selection(self)
        if self.db is None:
            gpu, start_of = self.gpu, selection.start_of
            if order == "start":
                ordered = sorted(range(len(gpu)), key=lambda i: (gpu[i][0], i))
            else:  # by stream, then the rounded start (as HTA sorts), ties in the trace's order
                ordered = sorted(range(len(gpu)), key=lambda i: (gpu[i][4], start_of(gpu[i][0]), i))
            rows = ((gpu[i], self.launches.get(gpu[i][5])) for i in ordered)
        else:
            self._flush()
            rounded = _CEILING if selection.fractional else "g.ts"
            by = "g.ts, g.rowid" if order == "start" else f"g.stream, {rounded}, g.rowid"
            query = (
                "SELECT g.ts, g.dur, g.name, g.category, g.stream, g.correlation, g.collective, l.ts "
                f"FROM gpu AS g JOIN launches AS l ON l.correlation = g.correlation ORDER BY {by}"
            )
            rows = ((tuple(row[:7]), row[7]) for row in self.db.execute(query))
        for row, launched in rows:
            activity = None if launched is None else selection.activity(row, launched)
            if activity is not None:
                yield activity

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


RANK_IN_NAME: Final = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


def rank_of(path: Path, declared: Any) -> int:
    """A file's rank: its ``distributedInfo``'s (``declared``), else the one its name names (``rank3.json.gz``)."""
    if isinstance(declared, int) and not isinstance(declared, bool) and declared >= 0:
        return declared
    named = RANK_IN_NAME.search(path.name)
    if named:
        return int(named.group(1))
    raise TraceError(
        f"{path}: no rank: the trace has no distributedInfo (torch.profiler writes it when torch.distributed "
        f"is initialised) and its file name names none; name it like rank3.json.gz or trace_rank-3.json"
    )


def read_rank_trace(path: Path) -> RankTrace:
    """One rank's trace file: its rank (``distributedInfo``) and its selected GPU activities."""
    collected = _Collected()
    metadata = read_trace(path, collected.add)
    info = metadata.get("distributedInfo")
    info = info if isinstance(info, dict) else {}
    rank, world = info.get("rank"), info.get("world_size")
    activities, steps = select_activities(collected)
    return RankTrace(
        path=path,
        rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
        world_size=world if isinstance(world, int) and not isinstance(world, bool) else None,
        activities=activities,
        profiler_steps=steps,
        events=collected.events,
        metadata={k: v for k, v in metadata.items() if k != "deviceProperties"},
    )


@dataclass(frozen=True)
class RankActivities:
    """One rank's trace read onto disk (``rank_activities``): what ``RankTrace`` says of it, and its selected
    activities streamed in order of start and of stream, never all in memory."""

    rank: int | None
    profiler_steps: list[str]
    events: int
    collected: _SpilledCollected

    def p2p(self) -> list[P2pKernel]:
        """The rank's send and recv kernels that name a peer, launched before the last profiler step (HTA's rule
        for the figures), by start."""
        last = _selection(self.collected)[0].last_step
        return sorted(k for k in self.collected.p2p if last is None or k.start < last)

    def by_start(self) -> Iterator[GpuActivity]:
        return self.collected.activities("start")

    def by_stream(self) -> Iterator[GpuActivity]:
        return self.collected.activities("stream")


@contextmanager
def rank_activities(path: Path) -> Iterator[RankActivities]:
    """``path`` read once into a temporary SQLite file, removed on the way out."""
    collected = _SpilledCollected()
    try:
        metadata = read_trace(path, collected.add)
        info = metadata.get("distributedInfo")
        rank = info.get("rank") if isinstance(info, dict) else None
        yield RankActivities(
            rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
            profiler_steps=_selection(collected)[1],
            events=collected.events,
            collected=collected,
        )
    finally:
        collected.close()
