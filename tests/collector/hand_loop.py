"""A hand-written training loop with the collector, run as its own process by the tests.

    python -m tests.collector.hand_loop --url URL --spool DIR --run-key KEY --report out.json

It times the loop instrumented and, interleaved in blocks of ``BLOCK`` steps, the same loop
without collector calls (so both see the same machine load, which on a shared 2-core machine
changes over seconds), and writes a JSON report: step times, the shipper thread's CPU time,
how long ``shutdown`` took, how many spans were recorded and how many the collector counted as
dropped. Each step's thread CPU time is kept too: unlike wall time, other processes on the
machine do not inflate it; and the time each step waited for a CPU held by other processes.
The report also counts, through ``io_probe``, the calls that can hold a thread up (network
I/O, spool writes, sleeps, waits) that the collector made on the training thread during the
loop and those made on other threads (until the report is written). Anything the collector
raised into the loop would end the process with a traceback.

``--signal-at S --signal-file F`` writes F when instrumented step S starts (tests switch the
server's behaviour then).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from bubblescope import collector
from bubblescope.thread_cpu import thread_cpu_s
from tests.collector.io_probe import IoProbe

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


class RunQueueClock:
    """Nanoseconds this thread has spent runnable but not running (waiting for a CPU that other
    processes held), from Linux's /proc/self/task/<tid>/schedstat; 0 where unavailable.

    Read through ``ctypes.PyDLL``, which keeps the GIL: ``os.pread`` would release and retake it
    twice a step, and a thread that does that often starves every other thread of the GIL
    (CPython's convoy effect), here the shipper, which would then not send until the loop ends.
    """

    def __init__(self) -> None:
        self._buffer = ctypes.create_string_buffer(128)
        try:
            self._fd: int | None = os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY)
            self._pread = ctypes.PyDLL(None).pread
            self._pread.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
            self._pread.restype = ctypes.c_ssize_t
        except (OSError, AttributeError):
            self._fd = None

    def waited_ns(self) -> int:
        if self._fd is None:
            return 0
        size = self._pread(self._fd, self._buffer, len(self._buffer), 0)
        return int(self._buffer.raw[: max(0, size)].split()[1])


def timed(
    step: Any, args: argparse.Namespace, count: int, cpu: list[float], waited: list[float], clock: RunQueueClock
) -> list[float]:
    """Run ``count`` steps; returns their wall times, appends their thread CPU times to ``cpu``
    and the time they waited for a CPU (other processes running) to ``waited``."""
    times: list[float] = []
    for _ in range(count):
        began, began_cpu, began_wait = time.perf_counter(), time.thread_time(), clock.waited_ns()
        step(args)
        times.append(time.perf_counter() - began)
        cpu.append(time.thread_time() - began_cpu)
        waited.append((clock.waited_ns() - began_wait) / 1e9)
    return times


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    probe = IoProbe().install()
    collector.init(
        run="hand-loop",
        url=args.url,
        spool_dir=args.spool,
        run_key=args.run_key,
        full_spans_every=args.full_spans_every,
    )
    session = collector._session  # test probe: the drop counter is read after shutdown
    threads_after_init = sorted(thread.name for thread in threading.enumerate())
    instrumented: list[float] = []
    baseline: list[float] = []
    instrumented_cpu: list[float] = []
    baseline_cpu: list[float] = []
    instrumented_wait: list[float] = []
    baseline_wait: list[float] = []
    clock = RunQueueClock()
    blocks = max(1, args.steps // BLOCK)
    loop_began = time.perf_counter()
    probe.open = True
    for step in range(args.steps):
        if step == args.signal_at and args.signal_file:
            Path(args.signal_file).write_text(str(step))
        instrumented += timed(instrumented_step, args, 1, instrumented_cpu, instrumented_wait, clock)
        if (step + 1) % BLOCK == 0:  # the same loop uninstrumented, interleaved: same machine load
            baseline += timed(plain_step, args, args.baseline_steps // blocks, baseline_cpu, baseline_wait, clock)
    probe.open = False
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
        "baseline_cpu_wait_s": baseline_wait,
        "instrumented_cpu_wait_s": instrumented_wait,
        "loop_s": loop_s,
        "shipper_cpu_s": shipper_cpu_s,
        "shutdown_s": shutdown_s,
        "spans_recorded": args.steps * args.spans,
        "dropped_spans": session.shipper.dropped_spans if session is not None else None,
        "shipper_alive": session is not None and session.shipper._thread.is_alive(),
        "enabled": session is not None,
        "threads_after_init": threads_after_init,
        "io_calls": probe.report(),
    }
    Path(args.report).write_text(json.dumps(report))


if __name__ == "__main__":
    main()
