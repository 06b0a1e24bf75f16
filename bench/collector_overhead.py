"""Step time of the demo pipeline job against an uninstrumented baseline: interleaved runs.

Modes, each a real torchrun job (gloo, CPU): ``off`` (no collector), ``defaults`` (the
collector as shipped: aggregates every step, full spans every N-th), ``full`` (full spans every
step), ``profiler`` (no collector; ``torch.profiler`` recording CPU activities, the anchor a
user would otherwise reach for). Rank 0 writes its step times; the first steps (warm-up, shape
inference) are dropped; a run's figure is its median step time. Every round runs every mode in
a random order, so drift in the machine hits all alike; the figure per mode is the median over
rounds of its ratio to the same round's ``off`` run.

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
from bubblescope.collector.config import DEFAULT_FULL_SPANS_EVERY  # noqa: E402
from tests.support import start_server  # noqa: E402

WARMUP_STEPS = 3


MODES = ("off", "defaults", "full", "profiler")


def run_job(args: argparse.Namespace, url: str, mode: str, workdir: Path) -> float:
    times_file = workdir / f"times-{random.random():.12f}.txt"
    env = {**os.environ, "BUBBLESCOPE_URL": url, "OMP_NUM_THREADS": "1",
           "BUBBLESCOPE_DEMO_TIMES": str(times_file), "BUBBLESCOPE_SPOOL_DIR": str(workdir / "spool"),
           "BUBBLESCOPE_FULL_SPANS_EVERY": "1" if mode == "full" else str(DEFAULT_FULL_SPANS_EVERY)}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.stages}",
        "-m", "bubblescope.demo_job", f"--schedule={args.schedule}", f"--microbatches={args.microbatches}",
        f"--steps={args.steps}", f"--hidden={args.hidden}", f"--microbatch-size={args.microbatch_size}",
    ]
    if mode in ("off", "profiler"):
        command.append("--no-collector")
    if mode == "profiler":
        command.append("--torch-profiler")
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
    medians: dict[str, list[float]] = {mode: [] for mode in MODES}
    ratios: dict[str, list[float]] = {mode: [] for mode in MODES if mode != "off"}
    try:
        for round_index in range(args.rounds):
            order = list(MODES)
            random.shuffle(order)
            result = {mode: run_job(args, server.url, mode, workdir) for mode in order}
            for mode, value in result.items():
                medians[mode].append(value)
                if mode != "off":
                    ratios[mode].append(value / result["off"])
            print(f"round {round_index}: " + "  ".join(
                f"{mode} {result[mode] * 1e3:7.2f} ms" for mode in MODES), flush=True)
    finally:
        server.stop()
    off = statistics.median(medians["off"])
    print(f"\njob: {args.stages} stages, {args.schedule}, m={args.microbatches}, hidden={args.hidden}, "
          f"{args.steps} steps/run (first {WARMUP_STEPS} dropped), {args.rounds} interleaved rounds")
    print(f"median step time off: {off * 1e3:.2f} ms")
    targets = {"defaults": "<= 1.01", "full": "<= 1.03", "profiler": "(reference)"}
    for mode, values in ratios.items():
        print(f"{mode:9s} median paired ratio {statistics.median(values):.4f}  "
              f"ratio of medians {statistics.median(medians[mode]) / off:.4f}  target {targets[mode]}")
    span_ns, wrapper_ns = training_thread_cost_per_span(workdir)
    spans_per_step = 4 * args.microbatches + 3
    bound = spans_per_step * max(span_ns, wrapper_ns) / (off * 1e9)
    print(f"training-thread cost: collector.span {span_ns:.0f} ns/span, pipelining wrapper {wrapper_ns:.0f} ns/span; "
          f"{spans_per_step} spans/step -> {100 * bound:.3f}% of the {off * 1e3:.1f} ms step")


if __name__ == "__main__":
    main()
