"""Hostile request bodies, each refused by a real server with its status and error, quickly, in bounded memory.

One bomb per test (docs/limits.md has the limits they hit): gzip bombs (250 MiB of JSON integers in
~250 KiB, 1 GiB of spaces in ~1 MB), nesting 100,000 deep (alone, inside a batch, inside a run's
config), a JSON value bomb under the byte cap, a batch of a million spans, a batch one span past the
limit, two bombs at once, a 20 MB run config and one of 10,000 keys. Each test checks that:

- the answer is the expected status, its first error naming where (``loc``) with its ``type``;
- the refusal takes under ``REFUSE_S``: a margin for a loaded 2-core CI machine (bench/hostile.py
  reports the real figures, well under a second);
- the server process's resident memory (VmRSS sampled every 5 ms, and VmHWM, reset before the bomb
  through /proc/<pid>/clear_refs where that is allowed) stays within ``MEMORY_BYTES`` of its level
  just before the bomb, and what is left afterwards is within ``MEMORY_BYTES`` of the module's idle
  level (nothing accumulates from bomb to bomb);
- /api/v1/health (and GET /runs where said), polled on its own connection from before the bomb is
  sent until it is answered, answers 200 within ``HEALTH_S`` each time;
- nothing was stored: every table's row count is unchanged.

The server is this module's own (SQLite, warmed up before its idle memory is read), so other
tests' work does not blur the memory figures. Negative control: with
``HOSTILE_SERVE_ARGS="--max-json-bytes 4000000000 --max-json-values 1000000000"`` the server starts
with those limits lifted and the gzip, value and span bombs fail here (status, time or memory).

bench/hostile.py imports the bombs and the measurement from this module.
"""

from __future__ import annotations

import concurrent.futures
import functools
import gzip
import itertools
import json
import os
import shlex
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from bubblescope import wire
from bubblescope.backend.db import migrate
from bubblescope.backend.runs.service import MAX_CONFIG_DEPTH
from bubblescope.backend.settings import ServiceSettings
from tests.support import LiveServer, start_server

MB = 1_000_000
MiB = 1024 * 1024
REFUSE_S = 5.0
HEALTH_S = 5.0
MEMORY_BYTES = 200 * MB
HEALTH = "/api/v1/health"
RUNS = "/api/v1/runs"
INGEST = "/api/v1/ingest"
TARGET_RUN = "hostile-target"  # registered by the fixture; the batch bombs name it
TABLES = ("runs", "ranks", "steps", "spans", "ingested_batches", "capture_requests")
JSON = {"Content-Type": "application/json"}
GZIP_JSON = {**JSON, "Content-Encoding": "gzip"}
DEEP = 100_000

pytestmark = [
    pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads memory from /proc (Linux)"),
    pytest.mark.timing,  # the service's memory and its health probes' latency while it refuses bombs
]


# The bombs ---------------------------------------------------------------------------------------


def gzip_repeated(head: bytes, chunk: bytes, count: int, tail: bytes) -> bytes:
    """gzip of ``head + chunk * count + tail``, compressing ``chunk`` once (a 1 GiB bomb in 0.3 s).

    Each part is deflated on its own and ended with a full flush, which empties the compressor's
    window: the blocks of ``chunk`` are the same bytes each time and can be repeated as they are."""

    def deflate(data: bytes, mode: int) -> bytes:
        compressor = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
        return compressor.compress(data) + compressor.flush(mode)

    crc = zlib.crc32(head)
    for _ in range(count):
        crc = zlib.crc32(chunk, crc)
    crc = zlib.crc32(tail, crc)
    size = len(head) + len(chunk) * count + len(tail)
    return b"".join(
        [
            b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff",  # gzip header: deflate, no name, no time
            deflate(head, zlib.Z_FULL_FLUSH),
            deflate(chunk, zlib.Z_FULL_FLUSH) * count,
            deflate(tail, zlib.Z_FINISH),
            struct.pack("<II", crc, size & 0xFFFFFFFF),
        ]
    )


def span_batch(spans: int, seq: int, columns: Sequence[str] = wire.SPAN_FIELDS) -> bytes:
    """A gzipped ingest batch of ``spans`` valid spans for ``TARGET_RUN``, written as JSON text directly
    (a million spans in about a second, where json.dumps of lists would take several)."""
    base = 1_760_000_000_000_000_000
    starts = range(base, base + 1000 * spans, 1000)
    values = {
        "step": lambda: ["0"] * spans,
        "kind": lambda: ['"forward"'] * spans,
        "start_ns": lambda: map(str, starts),
        "end_ns": lambda: (str(start + 700) for start in starts),
        "stage": lambda: ["0"] * spans,
        "microbatch": lambda: (str(index % 16) for index in range(spans)),
        "peer": lambda: ["null"] * spans,
        "bytes": lambda: ["4096"] * spans,
        "group": lambda: ['"pp"'] * spans,
        "name": lambda: ['"fwd"'] * spans,
    }
    body = ",".join(f'"{column}":[{",".join(values[column]())}]' for column in columns)
    document = f'{{"run_key":"{TARGET_RUN}","rank":0,"seq":{seq},"spans":{{{body}}}}}'
    return gzip.compress(document.encode(), compresslevel=1)


def registration(config: str) -> bytes:
    return f'{{"name":"hostile","world_size":1,"config":{config}}}'.encode()


@functools.cache
def gzip_integers() -> bytes:
    return gzip_repeated(b"[", b"1," * (MiB // 2), 250, b"1]")  # 250 MiB of JSON, ~250 KiB gzipped


@functools.cache
def gzip_spaces_31mib() -> bytes:
    return gzip_repeated(b"", b" " * MiB, 31, b"")  # under the JSON byte cap: each is read in full


@functools.cache
def gzip_spaces() -> bytes:
    return gzip_repeated(b"", b" " * MiB, 1024, b"")  # 1 GiB of spaces, ~1 MB gzipped


def deep(levels: int = DEEP) -> str:
    return "[" * levels + "]" * levels


@functools.cache
def deep_plain() -> bytes:
    return deep().encode()


@functools.cache
def deep_in_batch() -> bytes:
    """A valid one-span batch but for one name, which is a list nested 100,000 deep."""
    spans = f'"step":[0],"kind":["forward"],"start_ns":[1],"end_ns":[2],"name":[{deep()}]'
    return f'{{"run_key":"{TARGET_RUN}","rank":0,"seq":900001,"spans":{{{spans}}}}}'.encode()


@functools.cache
def deep_in_config() -> bytes:
    return registration(f'{{"layers":{deep()}}}')


@functools.cache
def config_nested_500() -> bytes:
    """Nested below the parser's limit (it parses), far past the config's own depth limit."""
    return registration(f'{{"layers":{deep(500)}}}')


@functools.cache
def empty_lists() -> bytes:
    return b"[" + b"[]," * (8 * MiB // 3) + b"[]]"  # 8 MiB, 2.8 M values: under the byte caps


@functools.cache
def nested_lists() -> bytes:
    """8 MiB of lists nested 400 deep, side by side: 4.2 M lists, but only 10,000 commas."""
    return b"[" + b",".join([deep(400).encode()] * (8 * MiB // 801)) + b"]"


@functools.cache
def million_spans() -> bytes:
    return span_batch(1_000_000, seq=900002)  # 77 MB of JSON, 5 MB gzipped


@functools.cache
def million_steps_column() -> bytes:
    return span_batch(1_000_000, seq=900003, columns=("step",))  # 2 MB of JSON: under every byte cap


@functools.cache
def spans_past_the_limit() -> bytes:
    return span_batch(100_001, seq=900004)


@functools.cache
def config_20mb() -> bytes:
    return registration(json.dumps({"notes": "x" * 20_000_000}))


@functools.cache
def config_10000_keys() -> bytes:
    return registration(json.dumps({f"key{index}": index for index in range(10_000)}))  # 140 KB


@dataclass(frozen=True)
class Bomb:
    """A hostile request and the refusal it must get: ``status``, the first error's ``loc`` and ``type``,
    and ``words`` in its message."""

    name: str
    method: str
    path: str
    body: Callable[[], bytes]  # cached: built once
    gzipped: bool
    status: int
    loc: tuple[str | int, ...]
    error_type: str
    words: str

    @property
    def headers(self) -> dict[str, str]:
        return GZIP_JSON if self.gzipped else JSON


INFLATED = "decompressed payload exceeds"
VALUES = "JSON values (the limit)"
GZIP_INTEGERS = Bomb("gzip-250MiB-integers", "POST", INGEST, gzip_integers, True, 413, ("body",), "too_large", VALUES)
GZIP_SPACES = Bomb("gzip-1GiB-spaces", "POST", INGEST, gzip_spaces, True, 413, ("body",), "too_large", INFLATED)
TOO_DEEP = "nested too deeply"
DEEP_PLAIN = Bomb("deep-100k-plain", "POST", INGEST, deep_plain, False, 400, ("body",), "json_invalid", TOO_DEEP)
DEEP_IN_BATCH = Bomb(
    "deep-100k-in-batch", "POST", INGEST, deep_in_batch, False, 400, ("body",), "json_invalid", TOO_DEEP
)
DEEP_IN_CONFIG = Bomb(  # a registration takes at most 100,000 values: counted before the parser sees the depth
    "deep-100k-in-config",
    "PUT",
    f"{RUNS}/hostile-deep-config",
    deep_in_config,
    False,
    413,
    ("body",),
    "too_large",
    VALUES,
)
CONFIG_NESTED = Bomb(
    "config-nested-500",
    "PUT",
    f"{RUNS}/hostile-nested-config",
    config_nested_500,
    False,
    422,
    ("body", "config", "layers", *[0] * (MAX_CONFIG_DEPTH - 1)),
    "value_error",
    f"nested deeper than {MAX_CONFIG_DEPTH} levels",
)
EMPTY_LISTS = Bomb("values-8MiB-empty-lists", "POST", INGEST, empty_lists, False, 413, ("body",), "too_large", VALUES)
NESTED_LISTS = Bomb(
    "values-8MiB-nested-lists", "POST", INGEST, nested_lists, False, 413, ("body",), "too_large", VALUES
)
MILLION_SPANS = Bomb("spans-1M-all-columns", "POST", INGEST, million_spans, True, 413, ("body",), "too_large", VALUES)
MILLION_STEPS_COLUMN = Bomb(
    "spans-1M-step-column",
    "POST",
    INGEST,
    million_steps_column,
    True,
    413,
    ("body", "spans", "step"),
    "too_large",
    "1000000 spans exceed the limit of 100000",
)
SPANS_PAST_THE_LIMIT = Bomb(
    "spans-100001",
    "POST",
    INGEST,
    spans_past_the_limit,
    True,
    413,
    ("body", "spans", "step"),
    "too_large",
    "100001 spans exceed the limit of 100000",
)
CONFIG_20MB = Bomb(
    "config-20MB",
    "PUT",
    f"{RUNS}/hostile-big-config",
    config_20mb,
    False,
    413,
    ("body",),
    "too_large",
    "exceeds the limit of 1048576",
)
CONFIG_10000_KEYS = Bomb(
    "config-10000-keys",
    "PUT",
    f"{RUNS}/hostile-many-keys",
    config_10000_keys,
    False,
    413,
    ("body", "config"),
    "too_large",
    "10000 keys",
)
BOMBS = (
    GZIP_INTEGERS,
    GZIP_SPACES,
    DEEP_PLAIN,
    DEEP_IN_BATCH,
    DEEP_IN_CONFIG,
    CONFIG_NESTED,
    EMPTY_LISTS,
    MILLION_SPANS,
    MILLION_STEPS_COLUMN,
    SPANS_PAST_THE_LIMIT,
    CONFIG_20MB,
    CONFIG_10000_KEYS,
)
PAIR = (GZIP_INTEGERS, GZIP_SPACES)


# Watching the server while it refuses them -------------------------------------------------------


def memory(pid: int) -> tuple[int, int]:
    """The process's resident memory now and its peak (VmRSS, VmHWM), in bytes."""
    found: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(("VmRSS:", "VmHWM:")):
                name, kilobytes, _unit = line.split()
                found[name] = int(kilobytes) * 1024
    return found["VmRSS:"], found["VmHWM:"]


def reset_peak(pid: int) -> bool:
    """Reset VmHWM to the current VmRSS (Linux 4.0+, same user); False where that is not allowed."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def settled_rss(pid: int, timeout_s: float = 5.0) -> int:
    """VmRSS once it stops moving (a refused document may still be being freed after the answer)."""
    last = memory(pid)[0]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = memory(pid)[0]
        if abs(now - last) < MB:
            return now
        last = now
    return last


@dataclass(frozen=True)
class Probe:
    path: str
    status: int | None  # None: no answer
    seconds: float
    error: str = ""


@dataclass(frozen=True)
class Outcome:
    responses: list[httpx.Response]
    seconds: list[float]
    idle_rss: int  # just before the bombs
    peak_rss: int  # while they were refused
    after_rss: int  # settled afterwards
    probes: list[Probe]

    @property
    def worst_probe_s(self) -> float:
        return max(probe.seconds for probe in self.probes)

    @property
    def probes_answered(self) -> bool:
        return bool(self.probes) and all(probe.status == 200 for probe in self.probes)


def fire(
    server: LiveServer,
    requests: Sequence[tuple[str, str, bytes, dict[str, str]]],
    probe_paths: Sequence[str] = (HEALTH,),
) -> Outcome:
    """Send ``requests`` (method, path, body, headers) at once, each on its own connection, while
    sampling the server's resident memory every 5 ms and polling ``probe_paths`` on another."""
    pid = server.process.pid
    idle = settled_rss(pid)
    peak_resettable = reset_peak(pid)
    sampled = [idle]
    probes: list[Probe] = []
    probing = threading.Event()
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.005):
            sampled.append(memory(pid)[0])

    def probe() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            for index in itertools.count():
                path = probe_paths[index % len(probe_paths)]
                probing.set()
                started = time.perf_counter()
                try:
                    probes.append(Probe(path, client.get(path).status_code, time.perf_counter() - started))
                except httpx.HTTPError as error:
                    probes.append(Probe(path, None, time.perf_counter() - started, repr(error)))
                if stop.wait(0.02):
                    return

    def send(request: tuple[str, str, bytes, dict[str, str]]) -> tuple[httpx.Response, float]:
        method, path, body, headers = request
        with httpx.Client(base_url=server.url, timeout=120) as client:
            started = time.perf_counter()
            response = client.request(method, path, content=body, headers=headers)
            return response, time.perf_counter() - started

    watchers = [threading.Thread(target=sample), threading.Thread(target=probe)]
    for watcher in watchers:
        watcher.start()
    try:
        probing.wait(10)
        with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
            answers = list(pool.map(send, requests))
    finally:
        stop.set()
        for watcher in watchers:
            watcher.join()
    peak = max(sampled)
    if peak_resettable:
        peak = max(peak, memory(pid)[1])
    return Outcome(
        responses=[response for response, _ in answers],
        seconds=[seconds for _, seconds in answers],
        idle_rss=idle,
        peak_rss=peak,
        after_rss=settled_rss(pid),
        probes=probes,
    )


def stored(db_url: str) -> dict[str, int]:
    """Rows in every table of the server's database."""
    from sqlalchemy import create_engine, text

    engine = create_engine(db_url)
    try:
        with engine.connect() as connection:
            return {
                table: int(connection.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()) for table in TABLES
            }
    finally:
        engine.dispose()


@dataclass(frozen=True)
class HostileServer:
    server: LiveServer
    idle_rss: int  # after the warm-up


def start_hostile_server(db_url: str, log_dir: Path, extra_args: Sequence[str] = ()) -> HostileServer:
    """A server on a migrated ``db_url``, with ``TARGET_RUN`` registered and every code path a bomb
    takes imported (the first requests import lazily), and its idle resident memory then."""
    server = start_server(db_url, log_dir, extra_args=extra_args)
    try:
        with server.client() as client:
            client.put(f"{RUNS}/{TARGET_RUN}", json={"name": "hostile", "world_size": 1}).raise_for_status()
            client.post(INGEST, content=span_batch(10, seq=0), headers=GZIP_JSON).raise_for_status()
            warm = [
                client.post(INGEST, content=gzip.compress(b"[" + b"1," * 100 + b"1]"), headers=GZIP_JSON),
                client.post(INGEST, content=b"[[[]]]", headers=JSON),
                client.put(f"{RUNS}/hostile-warm-up", content=registration('{"a":[[[[[[[[[[]]]]]]]]]]}'), headers=JSON),
                client.get(RUNS),
            ]
            assert [response.status_code for response in warm] == [422, 422, 422, 200], [r.text for r in warm]
    except BaseException:
        server.stop()
        raise
    return HostileServer(server, settled_rss(server.process.pid))


# The tests ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostileServer]:
    """This module's own server on SQLite (see the module docstring for HOSTILE_SERVE_ARGS)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('hostile-db') / 'bubblescope.db'}"
    migrate.upgrade(url)
    extra = shlex.split(os.environ.get("HOSTILE_SERVE_ARGS", ""))
    live = start_hostile_server(url, tmp_path_factory.mktemp("hostile-server"), extra)
    yield live
    live.server.stop()


def refuse(hostile: HostileServer, *bombs: Bomb, probe_paths: Sequence[str] = (HEALTH,)) -> Outcome:
    """Fire ``bombs`` at once and check everything the module docstring lists."""
    requests = [(bomb.method, bomb.path, bomb.body(), bomb.headers) for bomb in bombs]  # built before timing
    before = stored(hostile.server.db_url)
    outcome = fire(hostile.server, requests, probe_paths)
    names = "+".join(bomb.name for bomb in bombs)
    for bomb, response, seconds in zip(bombs, outcome.responses, outcome.seconds):
        assert response.status_code == bomb.status, f"{bomb.name}: {response.status_code} {response.text[:500]}"
        first = response.json()["detail"][0]
        assert (first["loc"], first["type"]) == (list(bomb.loc), bomb.error_type), f"{bomb.name}: {first}"
        assert bomb.words in first["msg"], f"{bomb.name}: {first}"
        assert seconds < REFUSE_S, f"{bomb.name}: refused after {seconds:.2f} s"
    growth = outcome.peak_rss - outcome.idle_rss
    assert growth < MEMORY_BYTES, (
        f"{names}: resident memory peaked at {outcome.peak_rss / MB:.0f} MB, {growth / MB:.0f} MB over the "
        f"{outcome.idle_rss / MB:.0f} MB before (limit {MEMORY_BYTES / MB:.0f} MB)"
    )
    kept = outcome.after_rss - hostile.idle_rss
    assert kept < MEMORY_BYTES, (
        f"{names}: {outcome.after_rss / MB:.0f} MB resident afterwards, {kept / MB:.0f} MB over the idle "
        f"{hostile.idle_rss / MB:.0f} MB"
    )
    assert outcome.probes_answered, f"{names}: probes failed while refusing: {outcome.probes}"
    assert outcome.worst_probe_s < HEALTH_S, f"{names}: a probe took {outcome.worst_probe_s:.2f} s: {outcome.probes}"
    assert stored(hostile.server.db_url) == before, names
    return outcome


@pytest.mark.parametrize("bomb", [GZIP_INTEGERS, GZIP_SPACES], ids=lambda bomb: bomb.name)
def test_a_gzip_bomb_is_refused_while_it_is_inflated_not_after(hostile: HostileServer, bomb: Bomb) -> None:
    refuse(hostile, bomb)


@pytest.mark.parametrize("bomb", [DEEP_PLAIN, DEEP_IN_BATCH, DEEP_IN_CONFIG], ids=lambda bomb: bomb.name)
def test_nesting_100000_deep_is_refused_before_or_by_the_parser(hostile: HostileServer, bomb: Bomb) -> None:
    """Past the interpreter's recursion limit the parser gives up: the error names the body, not the field."""
    refuse(hostile, bomb)


def test_a_run_config_nested_past_its_depth_limit_is_refused_naming_where(hostile: HostileServer) -> None:
    refuse(hostile, CONFIG_NESTED)
    with hostile.server.client() as client:
        assert client.get(CONFIG_NESTED.path).status_code == 404


def test_a_value_bomb_under_the_byte_caps_is_counted_and_refused_before_parsing(hostile: HostileServer) -> None:
    limits = ServiceSettings()
    assert len(EMPTY_LISTS.body()) < min(limits.max_body_bytes, limits.max_json_bytes)
    refuse(hostile, EMPTY_LISTS)


def test_a_value_bomb_of_nested_lists_is_counted_and_refused_before_parsing(hostile: HostileServer) -> None:
    refuse(hostile, NESTED_LISTS)


@pytest.mark.parametrize("bomb", [MILLION_SPANS, MILLION_STEPS_COLUMN], ids=lambda bomb: bomb.name)
def test_a_batch_of_a_million_spans_is_refused_at_once_while_runs_are_listed(
    hostile: HostileServer, bomb: Bomb
) -> None:
    """All columns: past the JSON byte cap while inflating. One column only (2 MB, under every byte cap):
    parsed, and refused on the column's length before validation builds any of it."""
    refuse(hostile, bomb, probe_paths=(HEALTH, RUNS))


def test_a_batch_one_span_past_the_limit_is_refused_naming_the_column(hostile: HostileServer) -> None:
    refuse(hostile, SPANS_PAST_THE_LIMIT)


def test_two_gzip_bombs_at_once_stay_within_the_memory_bound(hostile: HostileServer) -> None:
    refuse(hostile, *PAIR)


@pytest.mark.parametrize("bomb", [CONFIG_20MB, CONFIG_10000_KEYS], ids=lambda bomb: bomb.name)
def test_an_oversized_run_config_is_refused_and_no_run_is_made(hostile: HostileServer, bomb: Bomb) -> None:
    refuse(hostile, bomb)
    with hostile.server.client() as client:
        assert client.get(bomb.path).status_code == 404


def test_many_bodies_at_once_are_bounded_together(hostile: HostileServer) -> None:
    """16 bodies of 31 MiB (gunzipped), each within every per-request limit: what the service holds of
    them at once is bounded by --max-bodies-bytes (the rest are told 503 busy), not 16 x 31 MiB."""
    body = gzip_spaces_31mib()
    before = stored(hostile.server.db_url)
    outcome = fire(hostile.server, [("POST", INGEST, body, GZIP_JSON)] * 16)
    for response in outcome.responses:
        assert response.status_code in (400, 503), response.text[:500]
        if response.status_code == 503:
            assert response.json()["detail"][0]["type"] == "busy" and response.headers["retry-after"]
    growth = outcome.peak_rss - outcome.idle_rss
    assert growth < MEMORY_BYTES, f"16 bodies at once: resident memory grew {growth / MB:.0f} MB"
    assert outcome.probes_answered and outcome.worst_probe_s < HEALTH_S, outcome.probes
    assert stored(hostile.server.db_url) == before
