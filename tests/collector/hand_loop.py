"""A hand-written training loop with the collector, run as its own process by the tests.

    python -m tests.collector.hand_loop --url URL --spool DIR --run-key KEY --report out.json

It times the loop instrumented and, interleaved in blocks of ``BLOCK`` steps, the same loop
without collector calls (so both see the same machine load, which on a shared 2-core machine
changes over seconds), and writes a JSON report: step times, the shipper thread's CPU time,
how long ``shutdown`` took, how many spans were recorded and how many the collector counted as
dropped. Each step's thread CPU time is kept too: unlike wall time, other processes on the
machine do not inflate it. Anything the collector raised into the loop would end the process with a traceback.

``--signal-at S --signal-file F`` writes F when instrumented step S starts (tests switch the
server's behaviour then).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from bubblescope import collector

KINDS = ("forward", "backward")
BLOCK = 20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default=None)
    parser.add_argument("--spool", required=True)
    parser.add_argument("--run-key", required=True)
    parser.add_argument("--report", required=True)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--baseline-steps", type=int, default=0, help="uninstrumented steps, interleaved")
    parser.add_argument("--spans", type=int, default=20, help="spans per step")
    parser.add_argument("--work", type=int, default=1500, help="sum(range(work)) inside each span")
    parser.add_argument("--sleep-s", type=float, default=0.0, help="sleep per step (paces the loop)")
    parser.add_argument("--full-spans-every", type=int, default=None)
    parser.add_argument("--signal-at", type=int, default=-1)
    parser.add_argument("--signal-file", default=None)
    return parser.parse_args(argv)


def plain_step(args: argparse.Namespace) -> None:
    for _ in range(args.spans):
        sum(range(args.work))
    if args.sleep_s:
        time.sleep(args.sleep_s)


def instrumented_step(args: argparse.Namespace) -> None:
    with collector.step():
        for index in range(args.spans):
            with collector.span(KINDS[index % 2], microbatch=index // 2, stage=0):
                sum(range(args.work))
        if args.sleep_s:
            time.sleep(args.sleep_s)


def timed(step: Any, args: argparse.Namespace, count: int, cpu: list[float]) -> list[float]:
    """Run ``count`` steps; returns their wall times and appends their thread CPU times to ``cpu``."""
    times: list[float] = []
    for _ in range(count):
        began, began_cpu = time.perf_counter(), time.thread_time()
        step(args)
        times.append(time.perf_counter() - began)
        cpu.append(time.thread_time() - began_cpu)
    return times


def thread_cpu_s(native_id: int | None) -> float | None:
    """CPU seconds a thread of this process has used (Linux /proc; None elsewhere)."""
    try:
        with open(f"/proc/self/task/{native_id}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    except (OSError, ValueError, IndexError):
        return None


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    collector.init(run="hand-loop", url=args.url, spool_dir=args.spool, run_key=args.run_key,
                   full_spans_every=args.full_spans_every)
    session = collector._session  # test probe: the drop counter is read after shutdown
    threads_after_init = sorted(thread.name for thread in threading.enumerate())
    instrumented: list[float] = []
    baseline: list[float] = []
    instrumented_cpu: list[float] = []
    baseline_cpu: list[float] = []
    blocks = max(1, args.steps // BLOCK)
    loop_began = time.perf_counter()
    for step in range(args.steps):
        if step == args.signal_at and args.signal_file:
            Path(args.signal_file).write_text(str(step))
        instrumented += timed(instrumented_step, args, 1, instrumented_cpu)
        if (step + 1) % BLOCK == 0:  # the same loop uninstrumented, interleaved: same machine load
            baseline += timed(plain_step, args, args.baseline_steps // blocks, baseline_cpu)
    loop_s = time.perf_counter() - loop_began
    shipper_cpu_s = thread_cpu_s(session.shipper._thread.native_id) if session is not None else None
    began = time.perf_counter()
    collector.shutdown()
    shutdown_s = time.perf_counter() - began
    report = {
        "baseline_s": baseline,
        "instrumented_s": instrumented,
        "baseline_cpu_s": baseline_cpu,
        "instrumented_cpu_s": instrumented_cpu,
        "loop_s": loop_s,
        "shipper_cpu_s": shipper_cpu_s,
        "shutdown_s": shutdown_s,
        "spans_recorded": args.steps * args.spans,
        "dropped_spans": session.shipper.dropped_spans if session is not None else None,
        "shipper_alive": session is not None and session.shipper._thread.is_alive(),
        "enabled": session is not None,
        "threads_after_init": threads_after_init,
    }
    Path(args.report).write_text(json.dumps(report))


if __name__ == "__main__":
    main()
