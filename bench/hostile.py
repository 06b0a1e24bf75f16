"""What refusing hostile bodies costs a real server: time to the refusal, resident memory, /health meanwhile.

Starts ``bubblescope serve`` (SQLite in a temporary folder unless ``--db`` or ``--postgres``), warms
it up, then fires each bomb of ``tests/hostile/test_bombs.py`` once (and two gzip bombs at once),
each after the server's memory has settled. Per row: the answer, the seconds to it, the server
process's resident memory (MB) just before, at its peak (VmRSS sampled every 5 ms and VmHWM reset
before the bomb) and once settled after, and whether /api/v1/health, polled every 20 ms on its own
connection meanwhile, always answered 200, with its worst latency. The tests assert the same
things with margins for a loaded CI machine; the figures are this script's.

Then lists nested without commas (in an ingest body and in a run config: counted by their brackets),
16 gzip bodies just under the JSON byte cap at once (refused on the value count) and 16 of spaces
(no values: bounded together by --max-bodies-bytes), and last a legitimate batch at the top of the
limits (100,000 spans, gzip), accepted, so the cost of the limits' top end is on record.

    python bench/hostile.py [--postgres | --db URL] [--only NAME,...]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bubblescope.backend.db import migrate
from tests.hostile.test_bombs import (
    BOMBS,
    GZIP_JSON,
    INGEST,
    JSON,
    MB,
    NESTED_LISTS,
    PAIR,
    RUNS,
    HostileServer,
    MiB,
    Outcome,
    deep,
    fire,
    gzip_repeated,
    gzip_spaces_31mib,
    registration,
    span_batch,
    start_hostile_server,
)
from tests.support import create_postgres_database, drop_postgres_database

Request = tuple[str, str, bytes, dict[str, str]]


@dataclass(frozen=True)
class Row:
    name: str
    requests: list[Request]


def rows() -> list[Row]:
    table = [Row(bomb.name, [(bomb.method, bomb.path, bomb.body(), bomb.headers)]) for bomb in BOMBS]
    table.append(Row("+".join(bomb.name for bomb in PAIR), [(b.method, b.path, b.body(), b.headers) for b in PAIR]))
    nested = NESTED_LISTS
    table.append(Row(nested.name, [(nested.method, nested.path, nested.body(), nested.headers)]))
    in_config = b",".join([deep(400).encode()] * (1000 * 1024 // 801))
    table.append(
        Row(
            "config-1MB-nested-lists",
            [("PUT", f"{RUNS}/hostile-nested-config", registration(f'{{"a":[{in_config.decode()}]}}'), JSON)],
        )
    )
    near_cap = gzip_repeated(b"[", b"1," * (MiB // 2), 31, b"1]")  # 31 MiB, 16 M values: refused on the count
    table.append(Row("16 x gzip-31MiB-integers", [("POST", INGEST, near_cap, GZIP_JSON)] * 16))
    table.append(Row("16 x gzip-31MiB-spaces (body budget)", [("POST", INGEST, gzip_spaces_31mib(), GZIP_JSON)] * 16))
    table.append(Row("legit-100000-spans (accepted)", [("POST", INGEST, span_batch(100_000, seq=1), GZIP_JSON)]))
    return table


def statuses(outcome: Outcome) -> str:
    counts = Counter(response.status_code for response in outcome.responses)
    return ", ".join(f"{code}" + (f" x{count}" if count > 1 else "") for code, count in sorted(counts.items()))


def measure(hostile: HostileServer, table: list[Row]) -> None:
    """Print the Markdown table, a row as each is measured."""
    print(
        "| request | on the wire | status | seconds | RSS idle MB | peak MB | peak - idle MB | after MB | /health answered (probes) | worst /health s |"
    )
    print("|---|--:|---|--:|--:|--:|--:|--:|---|--:|", flush=True)
    for row in table:
        outcome = fire(hostile.server, row.requests)
        wire = sum(len(body) for _, _, body, _ in row.requests)
        shown = f"{wire / MB:.2f} MB" if wire >= 10_000 else f"{wire:,} B"
        print(
            f"| {row.name} | {shown} | {statuses(outcome)} | {max(outcome.seconds):.2f} "
            f"| {outcome.idle_rss / MB:.0f} | {outcome.peak_rss / MB:.0f} "
            f"| {(outcome.peak_rss - outcome.idle_rss) / MB:.0f} | {outcome.after_rss / MB:.0f} "
            f"| {'yes' if outcome.probes_answered else 'NO'} ({len(outcome.probes)}) | {outcome.worst_probe_s:.3f} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--db", help="SQLAlchemy URL of an empty database (migrated here); default: SQLite in a tmp dir")
    where.add_argument("--postgres", action="store_true", help="a fresh database on 127.0.0.1:5432, dropped after")
    parser.add_argument("--only", default="", help="comma-separated substrings of the row names to run")
    args = parser.parse_args()

    table = rows()
    if args.only:
        table = [row for row in table if any(part in row.name for part in args.only.split(","))]
    workdir = Path(tempfile.mkdtemp(prefix="bench-hostile-"))
    dropped = None
    if args.postgres:
        db_url, dropped = create_postgres_database()
    else:
        db_url = args.db or f"sqlite:///{workdir / 'hostile.db'}"
    try:
        migrate.upgrade(db_url)
        hostile = start_hostile_server(db_url, workdir)
        try:
            backend = db_url.split(":", 1)[0]
            print(
                f"server on {backend}, idle RSS {hostile.idle_rss / MB:.0f} MB after warm-up; "
                f"{os.cpu_count()} CPUs, Python {platform.python_version()}; log {hostile.server.log_path}\n",
                flush=True,
            )
            measure(hostile, table)
        finally:
            hostile.server.stop()
    finally:
        if dropped is not None:
            drop_postgres_database(dropped)


if __name__ == "__main__":
    main()
