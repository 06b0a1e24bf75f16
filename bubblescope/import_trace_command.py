"""``bubblescope import-trace TRACE... [--run NAME] [--url URL | --db URL]``: profiler traces into a run.

Every file is read and converted first (``trace_import.convert_all``); only then is anything sent, in the order a
collector sends it (the run, each rank, its steps, its end), to a service (``--url``, through the collector's
transport, with its token) or straight into a database (``--db``, through the service's own routes in this
process, so the same validation applies). A re-import of the same files stores nothing twice (each step is one
batch, numbered by the step).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bubblescope import stop_signal
from bubblescope.input_files import missing_files
from bubblescope.kineto import TraceError
from bubblescope.trace_import import ImportedRank, convert_all, pipeline_config, requests_for, run_key_for

Send = Callable[[str, str, dict[str, Any]], tuple[bool, str]]  # (method, path, document) -> (ok, what went wrong)


def _over_http(url: str, token: str | None) -> Send:
    from bubblescope.collector.transport import Message, Verdict, readable, send

    def deliver(method: str, path: str, document: dict[str, Any]) -> tuple[bool, str]:
        body = gzip.compress(json.dumps(document, separators=(",", ":")).encode(), compresslevel=1)
        response = send(url, Message(method, path, body), token, timeout_s=120.0)
        if response.verdict is Verdict.DELIVERED:
            return True, ""
        status = f"HTTP {response.status}" if response.status else response.error or "no answer"
        return False, f"{method} {path}: {status}: {readable(response.body)}"

    return deliver


def _in_process(db_url: str) -> tuple[Send, Callable[[], None]]:
    with warnings.catch_warnings():  # starlette's notice that a future httpx is preferred: nothing to act on here
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient

    from bubblescope.backend.db.prepare import prepare_database
    from bubblescope.backend.server import ready_app

    client = TestClient(ready_app(prepare_database(db_url)), base_url="http://localhost")  # migrated, as serve does
    client.__enter__()

    def deliver(method: str, path: str, document: dict[str, Any]) -> tuple[bool, str]:
        response = client.request(method, path, json=document)
        if response.status_code < 300:
            return True, ""
        return False, f"{method} {path}: HTTP {response.status_code}: {response.text[:300]}"

    return deliver, lambda: client.__exit__(None, None, None)


def send_all(requests: Iterable[tuple[str, str, dict[str, Any]]], send: Send) -> None:
    """Every request in order; ``RuntimeError`` naming the first the service refused."""
    for method, path, document in requests:
        stop_signal.check()
        ok, problem = send(method, path, document)
        if not ok:
            raise RuntimeError(problem)


def _sender(args: argparse.Namespace) -> tuple[Send, Callable[[], None], str] | str:
    """(send, close, where it goes), or what is wrong with the options."""
    if args.db:
        from sqlalchemy.exc import ArgumentError

        from bubblescope.backend.db.prepare import DatabaseNotReady

        try:
            send, close = _in_process(args.db)
        except (DatabaseNotReady, ArgumentError, ValueError) as error:  # ArgumentError: not a database URL
            return f"--db {args.db!r}: {str(error).splitlines()[0]}"
        return send, close, args.db
    from bubblescope.collector.config import URL, env_setting

    url = args.url or env_setting("url")
    if url is None:
        return "no service: give --url URL (or BUBBLESCOPE_URL) or --db URL"
    try:
        url = URL.parse(url)
    except ValueError:
        return f"--url {url!r} is not {URL.accepts}"
    return _over_http(url, args.token or env_setting("token")), lambda: None, url


def main(args: argparse.Namespace) -> int:
    refusal = missing_files("import-trace", args.traces)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    paths = [Path(p) for p in args.traces]
    name = args.run or paths[0].name.split(".")[0]
    key = run_key_for(name)
    schedule = _schedule(args.schedule)
    if schedule is not None and schedule.startswith("--schedule"):
        print(f"bubblescope import-trace: {schedule}", file=sys.stderr)
        return 2
    sender = _sender(args)  # before reading: a wrong address or database is said at once
    if isinstance(sender, str):
        print(f"bubblescope import-trace: {sender}", file=sys.stderr)
        return 2
    send, close, where = sender
    try:
        single_stage = schedule is not None and _one_stage_a_rank(schedule)
        imported = convert_all(paths, key, single_stage)  # every file read before anything is sent
    except TraceError as error:
        close()
        print(f"bubblescope import-trace: {error}", file=sys.stderr)
        return 2
    try:
        send_all(requests_for(imported, key, name, schedule), send)
    except RuntimeError as error:
        print(f"bubblescope import-trace: {error}", file=sys.stderr)
        return 1
    finally:
        close()
    ranks = [r.rank for r in imported]
    steps = sum(len(r.steps) for r in imported)
    print(
        f"imported {len(ranks)} rank{'s' if len(ranks) != 1 else ''} ({', '.join(map(str, ranks))}), {steps} rank-steps"
    )
    found = _pipeline_found(imported, schedule)
    if found:
        print(found)
    print(f"run {key} in {where}" + ("" if args.db else f": open {where.rstrip('/')}/runs/{key}"))
    return 0


def _pipeline_found(imported: list[ImportedRank], schedule: str | None) -> str | None:
    """What the files said of a pipeline, and what the run makes of it (None: nothing to say)."""
    found = sorted({stage for rank in imported for stage in rank.stages})
    if not found:
        return (
            None
            if not schedule
            else (
                f"no pipeline actions found: --schedule {schedule} not used (torch annotates interleaved, zero-bubble "
                "and GPipe schedules; 1F1B's steps are cut at their P2P calls, in a pure pipeline only)"
            )
        )
    pipeline = pipeline_config(imported, schedule)
    if not pipeline:
        return (
            f"pipeline actions of stages {', '.join(map(str, found))}: not every stage from 0 (a part of the job's "
            "files, or a layout other than a pure pipeline): no replay"
        )
    said = f"pipeline actions: {pipeline['num_stages']} stages, {pipeline['num_microbatches']} micro-batches"
    return said + ("" if schedule else "; give --schedule NAME (no trace names it) for the bubble's replay and causes")


def _one_stage_a_rank(schedule: str) -> bool:
    """Whether each rank runs one stage (GPipe, 1F1B, the naive split): its unannotated steps can be cut."""
    from bubblescope.analysis import lookup

    return lookup(schedule).placement == "single"


def _schedule(name: str | None) -> str | None:
    """The schedule's canonical name, or a message starting "--schedule" saying what is known."""
    if name is None:
        return None
    from bubblescope.analysis import ScheduleError, lookup

    try:
        return lookup(name).name
    except ScheduleError as error:
        return f"--schedule: {error.message}"
