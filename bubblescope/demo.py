"""``bubblescope demo``: a local service plus a real CPU pipeline-parallel job streaming into it
(with ``--url``: the job alone, streaming into that running service)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import urllib.parse
import uuid

from bubblescope.analysis import Schedule, lookup
from bubblescope.ports import can_listen, free_port, taken_message

DEFAULT_PORT = 8765
TOUR_SILENT_AFTER_S = 3600.0
DEFAULT_STAGES = 4
"""Stages (one process each) when the machine has the cores for them; fewer cores, fewer stages (at least 2)."""


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the system has one, as in a container)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def size_to_machine(args: argparse.Namespace, cores: int) -> str | None:
    """Fills the sizes left unset: ``DEFAULT_STAGES`` stages, no more than ``cores`` (more processes than cores
    time-share them, and the page then shows the runtime's jitter, not the pipeline), and as few micro-batches as the
    schedule allows, at least as many as stages (1F1B's bubble is then (p−1)/(2p−1): the schedule's fill and drain,
    and a fix worth pricing). Returns the line that says why the stages were lowered, else None."""
    note = None
    if args.stages is None:
        args.stages = max(2, min(DEFAULT_STAGES, cores))
        if args.stages < DEFAULT_STAGES:
            note = (
                f"{args.stages} stages, not {DEFAULT_STAGES}: this machine has {cores} core{'s' if cores > 1 else ''} "
                "and one process per stage (--stages to choose)"
            )
    if args.microbatches is None:
        args.microbatches = default_microbatches(lookup(args.schedule), args.stages)
    return note


def default_microbatches(schedule: Schedule, stages: int) -> int:
    """As many micro-batches as stages, or what the schedule needs: 1 for the layer-wise split, one per stage for
    those that run several stages a rank."""
    if schedule.min_microbatches == "one":
        return 1
    if schedule.min_microbatches == "stages":
        return stages * schedule.default_stages_per_rank
    return stages


def job_command(args: argparse.Namespace) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={args.stages}",
        "-m",
        "bubblescope.demo_job",
        f"--schedule={args.schedule}",
        f"--microbatches={args.microbatches}",
        f"--steps={args.steps}",
        f"--hidden={args.hidden}",
        f"--layers-per-stage={args.layers_per_stage}",
        *([f"--microbatch-size={args.microbatch_size}"] if args.microbatch_size else []),
    ]


def run_job(args: argparse.Namespace, url: str, run_key: str) -> int:
    env = {
        **os.environ,
        "BUBBLESCOPE_URL": url,
        "BUBBLESCOPE_RUN_ID": run_key,
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    if args.lowered:
        print(args.lowered, flush=True)
    print(
        f"training: {args.stages} stages, {args.schedule}, {args.microbatches} micro-batches, {args.steps} steps",
        flush=True,
    )
    return subprocess.call(job_command(args), env=env)


def say_how_the_job_ended(code: int) -> None:
    if code == 0:
        print("training job finished", flush=True)
        return
    print(
        f"bubblescope demo: the training job FAILED (exit code {code}); its error is above. The "
        f"dashboard shows only what it streamed before failing.",
        file=sys.stderr,
        flush=True,
    )


def run_tour(base: str) -> int:
    """Every stop of the tour (``bubblescope.tour``) into the service at ``base``; 1 when a stop went wrong."""
    from bubblescope.tour import STOPS, Tour

    print(f"the tour: {len(STOPS)} runs, one after another; watch them arrive in the run list: {base}/", flush=True)
    wrong = Tour(base, lambda line: print(line, flush=True)).run()
    print(f"tour over: {len(STOPS) - wrong} of {len(STOPS)} runs as planned; the run list: {base}/", flush=True)
    return 1 if wrong else 0


def main(args: argparse.Namespace) -> int:
    args.lowered = size_to_machine(args, usable_cores())  # said when the job starts (the tour sizes its own jobs)
    if args.stages < 2:
        print("bubblescope demo: --stages must be at least 2 (one pipeline stage per process)", file=sys.stderr)
        return 2
    schedule = lookup(args.schedule)
    problem = schedule.shape_problem(args.stages, args.microbatches, schedule.default_stages_per_rank)
    if problem is not None and not args.tour:  # what torch would refuse, said before a job starts (the tour: its own)
        option = {"microbatches": "--microbatches", "ranks": "--stages"}.get(problem.field, "--schedule")
        print(f"bubblescope demo: {option}: {problem.message}", file=sys.stderr)
        return 2
    if args.url and urllib.parse.urlsplit(args.url).scheme not in ("http", "https"):
        print(f"bubblescope demo: --url {args.url!r}: expected http://HOST:PORT", file=sys.stderr)
        return 2
    if args.no_serve and not args.url:
        print("bubblescope demo: --no-serve needs --url of a running service", file=sys.stderr)
        return 2
    if args.url and (args.db or args.port):
        given = " and ".join(option for option, value in (("--db", args.db), ("--port", args.port)) if value)
        print(
            f"bubblescope demo: --url names a running service, and the demo starts none: drop {given}", file=sys.stderr
        )
        return 2
    from bubblescope.backend.settings import is_loopback

    if not args.url and not is_loopback(args.host):
        print(
            f"bubblescope demo: --host {args.host}: the demo's service has no auth, so it serves on loopback only; "
            "to share a demo, run `bubblescope serve --auth --host ...` (docs/access.md) and stream into it with "
            "`bubblescope demo --url`",
            file=sys.stderr,
        )
        return 2
    run_key = f"demo-{args.schedule}-p{args.stages}m{args.microbatches}-{uuid.uuid4().hex[:8]}"
    if args.url:  # a running service: stream into it, start none
        if args.tour:
            return run_tour(args.url.rstrip("/"))
        page = f"{args.url.rstrip('/')}/runs/{run_key}"
        print(f"streaming into the service at {args.url}; run page: {page}", flush=True)
        code = run_job(args, args.url, run_key)
        print(f"run page: {page}", flush=True)
        return code

    from bubblescope.backend.db.prepare import prepare_database
    from bubblescope.backend.server import build_server, start_in_thread
    from bubblescope.backend.settings import ServiceSettings

    if args.port and not can_listen(args.host, args.port):
        print(taken_message("demo", args.host, args.port), file=sys.stderr)
        return 2
    url_db = prepare_database(args.db)
    port = args.port or free_port(args.host, preferred=DEFAULT_PORT)
    if not args.port and port != DEFAULT_PORT:
        print(f"port {DEFAULT_PORT} is taken on {args.host}: serving on {port} instead (--port to choose)", flush=True)
    # The tour's hung run, its job ended, stays hung on its page for an hour before it reads as silent.
    settings = ServiceSettings(silent_after_s=TOUR_SILENT_AFTER_S) if args.tour else None
    server = build_server(url_db, args.host, port, settings)
    start_in_thread(server)
    base = f"http://{args.host}:{port}"
    print(f"bubblescope service on {base} (database {url_db})", flush=True)
    if args.tour:
        code, page = run_tour(base), f"{base}/"
    else:
        print(f"dashboard: {base}/runs/{run_key}", flush=True)
        code, page = run_job(args, base, run_key), f"{base}/runs/{run_key}"
        say_how_the_job_ended(code)
    if args.exit_after_job:
        kept = "the runs stay" if args.tour else "the run stays"
        print(f"the service stops (--exit-after-job); {kept} in the database {url_db}", flush=True)
        server.should_exit = True
        return code
    print(f"open the dashboard: {page} (serving until Ctrl-C)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.should_exit = True
    return code
