"""Collector memory over a long run: 10,000 steps of a hand-written loop, 20 spans a step.

Prints traced Python memory (tracemalloc, current) and RSS at 1k, 2k, 5k and 10k steps
(``--steps N``: at N/10, N/5, N/2 and N). Each
figure is taken once the shipper has caught up (its inbox and batch empty), so it shows what
the collector keeps, not the step or two in flight. Flat figures mean nothing grows per step.

    python bench/collector_memory.py                      # service down, 256 KiB spool bound
    python bench/collector_memory.py --url http://127.0.0.1:8765
    python bench/collector_memory.py --json               # one JSON line (used by the tests)
    python bench/collector_memory.py --steps 5000         # a shorter run
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bubblescope import collector


def checkpoints(steps: int) -> tuple[int, ...]:
    return (steps // 10, steps // 5, steps // 2, steps)


def rss_bytes() -> int:
    """Resident set size now (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def dead_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"  # closed again: nothing listens


def wait_for_shipper(timeout_s: float = 60.0) -> None:
    """Until the shipper has shipped every queued step (a test probe; the loop is paused).

    Flushes run one after another on the shipper thread, so once the queue and the batch are
    empty, a flush that *started* after that moment means the last real one has finished.
    """
    session = collector._session
    if session is None:
        return
    shipper = session.shipper
    deadline = time.monotonic() + timeout_s
    empty_since: float | None = None
    while time.monotonic() < deadline:
        if shipper._inbox or shipper._pending_steps:
            empty_since = None
        elif empty_since is None:
            empty_since = time.monotonic()
        elif shipper._last_flush > empty_since:
            return
        time.sleep(0.01)
    raise TimeoutError("the shipper did not catch up")


def measure(steps: int, spans: int, work: int, traced: bool) -> list[dict[str, Any]]:
    figures = []
    marks = checkpoints(steps)
    for step in range(1, steps + 1):
        with collector.step():
            for index in range(spans):
                with collector.span("forward" if index % 2 else "backward", microbatch=index // 2, stage=0):
                    sum(range(work))
        if step in marks:
            wait_for_shipper()
            gc.collect()
            current = tracemalloc.get_traced_memory()[0] if traced else None
            figures.append({"step": step, "traced_bytes": current, "rss_bytes": rss_bytes()})
    return figures


def run_child(args: argparse.Namespace) -> dict[str, Any]:
    """One measured run in this process: traced (tracemalloc) or plain (RSS without its overhead)."""
    traced = args.child == "traced"
    os.environ.setdefault("BUBBLESCOPE_SPOOL_MAX_BYTES", str(args.spool_max_bytes))
    os.environ.setdefault("BUBBLESCOPE_FLUSH_INTERVAL_S", "0.2")
    with tempfile.TemporaryDirectory() as spool:
        if traced:
            tracemalloc.start()
        collector.init(run="memory-bench", url=args.url or dead_url(), spool_dir=spool, run_key=f"memory-{os.getpid()}")
        started = time.perf_counter()
        figures = measure(args.steps, args.spans, args.work, traced)
        wall_s = time.perf_counter() - started
        dropped = collector._session.shipper.dropped_spans if collector._session else 0
        collector.shutdown()
        if traced:
            tracemalloc.stop()
    return {"figures": figures, "wall_s": wall_s, "dropped_spans": dropped}


def run_both(args: argparse.Namespace) -> dict[str, Any]:
    """Two child processes: tracemalloc figures from one, RSS from the other (tracemalloc's own
    bookkeeping grows RSS by tens of MiB over 10k steps, which would hide the collector's)."""
    results = {}
    for child in ("traced", "plain"):
        command = [
            sys.executable,
            __file__,
            "--child",
            child,
            "--spans",
            str(args.spans),
            "--work",
            str(args.work),
            "--spool-max-bytes",
            str(args.spool_max_bytes),
            "--steps",
            str(args.steps),
        ]
        if args.url:
            command += ["--url", args.url]
        done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600)
        results[child] = json.loads(done.stdout.strip().splitlines()[-1])
    figures = [
        {"step": traced["step"], "traced_bytes": traced["traced_bytes"], "rss_bytes": plain["rss_bytes"]}
        for traced, plain in zip(results["traced"]["figures"], results["plain"]["figures"])
    ]
    return {
        "figures": figures,
        "wall_s": results["plain"]["wall_s"],
        "wall_traced_s": results["traced"]["wall_s"],
        "dropped_spans": results["plain"]["dropped_spans"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=None, help="a running service (default: none listening)")
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--spans", type=int, default=20)
    parser.add_argument("--work", type=int, default=200, help="sum(range(work)) per span")
    parser.add_argument("--spool-max-bytes", type=int, default=256 * 1024)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", choices=("traced", "plain"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_child(args)))
        return
    result = run_both(args)
    if args.json:
        print(json.dumps(result))
        return
    figures = result["figures"]
    print(
        f"{args.steps} steps x {args.spans} spans in {result['wall_s']:.1f} s "
        f"({result['wall_traced_s']:.1f} s under tracemalloc); "
        f"{'service ' + args.url if args.url else 'service down'}, spool bound {args.spool_max_bytes} B, "
        f"dropped {result['dropped_spans']} spans"
    )
    print(f"{'step':>7} {'tracemalloc KiB':>16} {'RSS MiB':>9}")
    for row in figures:
        print(f"{row['step']:>7} {row['traced_bytes'] / 1024:>16.1f} {row['rss_bytes'] / 2**20:>9.1f}")
    first, last = figures[1], figures[-1]
    print(
        f"growth from step {first['step']} to {last['step']}: "
        f"{(last['traced_bytes'] - first['traced_bytes']) / 1024:+.1f} KiB traced, "
        f"{(last['rss_bytes'] - first['rss_bytes']) / 2**20:+.1f} MiB RSS"
    )


if __name__ == "__main__":
    main()
