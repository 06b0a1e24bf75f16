"""Step time of the demo pipeline job with the collector on vs off: interleaved runs, median ratio.

Each run is a real torchrun job (gloo, CPU). Rank 0 writes its step times; the first steps
(warm-up, shape inference) are dropped; a run's figure is its median step time. Runs alternate
on/off in a random order per round so drift in the machine hits both alike.

    python bench/collector_overhead.py [--rounds 5] [--steps 30] [--stages 2] [--microbatches 8]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bubblescope.backend.db import migrate  # noqa: E402
from tests.support import start_server  # noqa: E402

WARMUP_STEPS = 3


def run_job(args: argparse.Namespace, url: str, collector_on: bool, workdir: Path) -> float:
    times_file = workdir / f"times-{random.random():.12f}.txt"
    env = {**os.environ, "BUBBLESCOPE_URL": url, "OMP_NUM_THREADS": "1",
           "BUBBLESCOPE_DEMO_TIMES": str(times_file), "BUBBLESCOPE_SPOOL_DIR": str(workdir / "spool")}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.stages}",
        "-m", "bubblescope.demo_job", f"--schedule={args.schedule}", f"--microbatches={args.microbatches}",
        f"--steps={args.steps}", f"--hidden={args.hidden}", f"--microbatch-size={args.microbatch_size}",
    ]
    if not collector_on:
        command.append("--no-collector")
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=600)
    step_times = [float(line) for line in times_file.read_text().split()]
    return statistics.median(step_times[WARMUP_STEPS:])


def training_thread_cost_per_span(workdir: Path, iterations: int = 200_000) -> tuple[float, float]:
    """ns per span on the training thread: ``collector.span`` and the pipelining wrapper path.

    Measured in-process against a closed port (so the shipper spools), minus an empty loop.
    """
    import time

    from bubblescope import collector
    from bubblescope.collector import pipelining

    collector.init(run="micro", url="http://127.0.0.1:9", spool_dir=workdir / "micro-spool", run_key="micro")
    session = collector._session
    assert session is not None
    chunk = pipelining._timed(lambda chunk_id: chunk_id, session.recorder, 0, lambda _kwargs: "forward")

    def timed(body: object) -> float:
        started = time.perf_counter_ns()
        with collector.step():
            for i in range(iterations):
                body(i)  # type: ignore[operator]
        return (time.perf_counter_ns() - started) / iterations

    def via_span(i: int) -> None:
        with collector.span("forward", microbatch=i):
            pass

    empty = timed(lambda i: i)
    span_ns = timed(via_span) - empty
    wrapper_ns = timed(chunk) - empty
    collector.shutdown()
    return span_ns, wrapper_ns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--schedule", default="1f1b")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--microbatch-size", type=int, default=32)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp())
    db_url = f"sqlite:///{workdir / 'overhead.db'}"
    migrate.upgrade(db_url)
    server = start_server(db_url, workdir)
    medians: dict[bool, list[float]] = {True: [], False: []}
    ratios: list[float] = []
    try:
        for round_index in range(args.rounds):
            order = [True, False]
            random.shuffle(order)
            result = {mode: run_job(args, server.url, mode, workdir) for mode in order}
            for mode, value in result.items():
                medians[mode].append(value)
            ratios.append(result[True] / result[False])
            print(f"round {round_index}: off {result[False] * 1e3:7.2f} ms  on {result[True] * 1e3:7.2f} ms  "
                  f"ratio {ratios[-1]:.4f}", flush=True)
    finally:
        server.stop()
    off, on = statistics.median(medians[False]), statistics.median(medians[True])
    print(f"\njob: {args.stages} stages, {args.schedule}, m={args.microbatches}, hidden={args.hidden}, "
          f"{args.steps} steps/run (first {WARMUP_STEPS} dropped), {args.rounds} interleaved rounds")
    print(f"median step time: off {off * 1e3:.2f} ms, on {on * 1e3:.2f} ms")
    print(f"median of paired ratios on/off: {statistics.median(ratios):.4f}  (target <= 1.02)")
    print(f"ratio of medians: {on / off:.4f}")
    span_ns, wrapper_ns = training_thread_cost_per_span(workdir)
    spans_per_step = 4 * args.microbatches + 3
    bound = spans_per_step * max(span_ns, wrapper_ns) / (off * 1e9)
    print(f"training-thread cost: collector.span {span_ns:.0f} ns/span, pipelining wrapper {wrapper_ns:.0f} ns/span; "
          f"{spans_per_step} spans/step -> {100 * bound:.3f}% of the {off * 1e3:.1f} ms step")


if __name__ == "__main__":
    main()
