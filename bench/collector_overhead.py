"""Step time of the demo pipeline job against an uninstrumented baseline, measured two ways.

**Within one job** (the precise figure): the demo job with ``--ab-block K`` alternates blocks of
K steps with the collector and K steps without it, on the same stages, the baseline blocks under
a second, uninstrumented schedule inside ``collector.paused()``. Both sides share the process,
its memory layout, its core placement and the machine's load of that second, which separate
runs do not (run-to-run noise of the baseline alone is about ±15% here). The figure is the
median over block pairs of (median instrumented step / median baseline step), with the ratio of
total step times (instrumented / baseline: what the job pays in time, skewed less by single slow
steps than a mean of pair ratios) beside it. What the baseline blocks still carry, so the
figures are under-estimates: the process-wide P2P and collective wrappers in pass-through (a
clock read and a counter per P2P batch, about 2m calls a step), and the shipper thread, which
flushes on its own clock (once a second), so its work falls on both kinds of step alike and
cancels out of the ratio. Its CPU time per instrumented step is therefore reported beside the
ratio, as a share of the step: add it for the whole cost. The service's CPU is reported too: it
runs on the same 2 cores as the job here, which a deployed service does not; ``--service
answer-only`` replaces it by a stand-in that only acknowledges (``answer_only_service.py``), to
take that work off the job's cores. Blocks of one step (the default) in ABBA order.
``--python-wrappers-too`` adds the defaults without the C hot path (``BUBBLESCOPE_PURE_PYTHON=1``),
``--layers-off-too`` full capture without timing each stage's layers (``BUBBLESCOPE_STAGE_LAYERS=0``);
the modes take turns run by run, so drift in the machine hits all alike.

**Across jobs** (the anchor): modes, each a real torchrun job (gloo, CPU): ``off`` (no collector), ``defaults`` (the
collector as shipped: aggregates every step, full spans every N-th), ``full`` (full spans every
step), ``profiler`` (no collector; ``torch.profiler`` recording CPU activities, the anchor a
user would otherwise reach for). Rank 0 writes its step times; the first steps (warm-up, shape
inference) are dropped; a run's figure is its median step time. Every round runs every mode in
a random order, so drift in the machine hits all alike; the figure per mode is the median over
rounds of its ratio to the same round's ``off`` run.

    python bench/collector_overhead.py [--rounds 5] [--steps 30] [--ab-runs 3] [--ab-steps 1500] [--ab-block 1]
                                       [--service real|answer-only] [--python-wrappers-too]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.answer_only_service import start_answer_only
from bench.stats import median_interval
from bubblescope.backend.db import migrate
from bubblescope.collector.config import DEFAULT_FULL_SPANS_EVERY
from bubblescope.thread_cpu import process_cpu_s
from tests.support import start_server

WARMUP_STEPS = 3


MODES = ("off", "defaults", "full", "profiler")


def launch_demo(
    args: argparse.Namespace,
    url: str,
    mode: str,
    workdir: Path,
    steps: int,
    *extra: str,
    env: dict[str, str] | None = None,
) -> Path:
    """Run the demo job under torchrun; returns the file rank 0 wrote its step times to."""
    times_file = workdir / f"times-{random.random():.12f}.txt"
    env = {
        **os.environ,
        **(env or {}),
        "BUBBLESCOPE_URL": url,
        "OMP_NUM_THREADS": "1",
        "BUBBLESCOPE_SPOOL_DIR": str(workdir / "spool"),
    }
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={args.stages}",
        "-m",
        "bubblescope.demo_job",
        f"--schedule={args.schedule}",
        f"--microbatches={args.microbatches}",
        f"--steps={steps}",
        f"--hidden={args.hidden}",
        f"--microbatch-size={args.microbatch_size}",
        f"--times-file={times_file}",
        f"--full-spans-every={1 if mode == 'full' else DEFAULT_FULL_SPANS_EVERY}",
        *extra,
    ]
    if mode in ("off", "profiler"):
        command.append("--no-collector")
    if mode == "profiler":
        command.append("--torch-profiler")
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=900)
    return times_file


def run_job(args: argparse.Namespace, url: str, mode: str, workdir: Path) -> float:
    step_times = [float(line) for line in launch_demo(args, url, mode, workdir, args.steps).read_text().split()]
    return statistics.median(step_times[WARMUP_STEPS:])


@dataclass
class AbRun:
    wall_ratios: list[float]  # per block pair: median instrumented / median baseline wall step time
    cpu_ratios: list[float]  # the same for the training thread's CPU time
    step_s: float  # median instrumented step
    wall_sums_s: tuple[float, float]  # total wall time of the kept instrumented and baseline steps
    shipper_cpu_per_step_s: float | None


def run_ab_job(args: argparse.Namespace, url: str, mode: str, workdir: Path, env: dict[str, str]) -> AbRun:
    """One job alternating instrumented and baseline blocks; the first pairs are dropped (warm-up,
    the baseline schedule's shape inference)."""
    times_file = launch_demo(args, url, mode, workdir, args.ab_steps, f"--ab-block={args.ab_block}", env=env)
    document = json.loads(times_file.read_text())
    steps = document["steps"]
    size = 2 * args.ab_block
    warmup_pairs = -(-2 * WARMUP_STEPS // size) + 1
    pairs = [steps[i : i + size] for i in range(0, len(steps), size)][warmup_pairs:]
    pairs = [pair for pair in pairs if len(pair) == size]

    def ratios(field: str) -> list[float]:
        return [
            statistics.median(s[field] for s in pair if s["collected"])
            / statistics.median(s[field] for s in pair if not s["collected"])
            for pair in pairs
        ]

    collected = [s["wall_s"] for pair in pairs for s in pair if s["collected"]]
    baseline = [s["wall_s"] for pair in pairs for s in pair if not s["collected"]]
    shipper = document["shipper_cpu_s"]
    return AbRun(
        ratios("wall_s"),
        ratios("cpu_s"),
        statistics.median(collected),
        (sum(collected), sum(baseline)),
        None if shipper is None else shipper / (len(steps) / 2),
    )


@dataclass
class WithinJobMode:
    name: str
    collector_mode: str  # "defaults" or "full"
    env: dict[str, str]
    target: str
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    shares: list[float] = field(default_factory=list)
    totals: list[float] = field(default_factory=lambda: [0.0, 0.0])
    service_cpu_s: float = 0.0
    elapsed_s: float = 0.0


def within_job_modes(args: argparse.Namespace) -> list[WithinJobMode]:
    modes = [WithinJobMode("defaults", "defaults", {}, "<= 1.01"), WithinJobMode("full", "full", {}, "<= 1.03")]
    if args.python_wrappers_too:  # the collector without its C hot path, for comparison
        modes.append(WithinJobMode("defaults, Python wrappers", "defaults", {"BUBBLESCOPE_PURE_PYTHON": "1"}, "-"))
    if args.layers_off_too:  # the collector without timing each stage's layers, for comparison
        modes.append(WithinJobMode("full, layers not timed", "full", {"BUBBLESCOPE_STAGE_LAYERS": "0"}, "-"))
    return modes


def within_job(args: argparse.Namespace, url: str, workdir: Path, service_pid: int) -> None:
    """Runs of every mode in turn (run 0 of each, then run 1, ...), so drift hits all alike."""
    modes = within_job_modes(args)
    print(
        f"within one job: {args.ab_runs} runs per mode of {args.ab_steps} steps, blocks of {args.ab_block} "
        f"steps alternating with/without the collector (warm-up pairs dropped); modes in turn: "
        f"{', '.join(mode.name for mode in modes)}",
        flush=True,
    )
    for run in range(args.ab_runs):
        for mode in modes:
            service_cpu, started = process_cpu_s(service_pid) or 0.0, time.monotonic()
            result = run_ab_job(args, url, mode.collector_mode, workdir, mode.env)
            mode.service_cpu_s += (process_cpu_s(service_pid) or 0.0) - service_cpu
            mode.elapsed_s += time.monotonic() - started
            mode.wall += result.wall_ratios
            mode.cpu += result.cpu_ratios
            mode.totals = [mode.totals[0] + result.wall_sums_s[0], mode.totals[1] + result.wall_sums_s[1]]
            if result.shipper_cpu_per_step_s is not None:
                mode.shares.append(result.shipper_cpu_per_step_s / result.step_s)
            print(
                f"  {mode.name} run {run}: median pair ratio wall {statistics.median(result.wall_ratios):.4f}, "
                f"training-thread CPU {statistics.median(result.cpu_ratios):.4f} over {len(result.wall_ratios)} "
                f"pairs; step {result.step_s * 1e3:.2f} ms",
                flush=True,
            )
    for mode in modes:
        low, high = median_interval(mode.wall)
        cpu_low, cpu_high = median_interval(mode.cpu)
        shipper = f"{100 * statistics.median(mode.shares):.2f}%" if mode.shares else "n/a"
        print(
            f"{mode.name}: within-job median pair ratio: wall {statistics.median(mode.wall):.4f} "
            f"(95% CI {low:.4f}-{high:.4f}), ratio of total step times {mode.totals[0] / mode.totals[1]:.4f}; "
            f"training-thread CPU {statistics.median(mode.cpu):.4f} (95% CI {cpu_low:.4f}-{cpu_high:.4f}), "
            f"{len(mode.wall)} pairs; shipper thread CPU {shipper} of a step; the {args.service} service (same "
            f"2 cores) used {100 * mode.service_cpu_s / mode.elapsed_s:.2f}% of one core; target {mode.target}",
            flush=True,
        )


def training_thread_cost_per_span(workdir: Path, iterations: int = 200_000) -> tuple[float, float]:
    """ns per span on the training thread: ``collector.span`` and the pipelining wrapper path.

    Measured in-process against a closed port (so the shipper spools), minus an empty loop.
    """
    from bubblescope import collector
    from bubblescope.collector import pipelining

    collector.init(run="micro", url="http://127.0.0.1:9", spool_dir=workdir / "micro-spool", run_key="micro")
    session = collector._session
    assert session is not None
    chunk = pipelining._timed(lambda chunk_id: chunk_id, session.recorder, 0, "forward")

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
    parser.add_argument("--ab-runs", type=int, default=3, help="within-job runs per mode (0: skip)")
    parser.add_argument("--ab-steps", type=int, default=1500)
    parser.add_argument("--ab-block", type=int, default=1)
    parser.add_argument(
        "--python-wrappers-too",
        action="store_true",
        help="within one job, also the defaults without the C hot path (BUBBLESCOPE_PURE_PYTHON=1)",
    )
    parser.add_argument(
        "--layers-off-too",
        action="store_true",
        help="within one job, also full capture without timing each stage's layers (BUBBLESCOPE_STAGE_LAYERS=0)",
    )
    parser.add_argument(
        "--service",
        choices=("real", "answer-only"),
        default="real",
        help="answer-only: a stand-in that only acknowledges (the service's work off the job's cores)",
    )
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp())
    if args.service == "real":
        db_url = f"sqlite:///{workdir / 'overhead.db'}"
        migrate.upgrade(db_url)
        server = start_server(db_url, workdir)
    else:
        server = start_answer_only(workdir)
    medians: dict[str, list[float]] = {mode: [] for mode in MODES}
    ratios: dict[str, list[float]] = {mode: [] for mode in MODES if mode != "off"}
    try:
        if args.ab_runs:
            within_job(args, server.url, workdir, server.process.pid)
        print(f"\nacross jobs: {args.rounds} interleaved rounds", flush=True)
        for round_index in range(args.rounds):
            order = list(MODES)
            random.shuffle(order)
            result = {mode: run_job(args, server.url, mode, workdir) for mode in order}
            for mode, value in result.items():
                medians[mode].append(value)
                if mode != "off":
                    ratios[mode].append(value / result["off"])
            print(
                f"round {round_index}: " + "  ".join(f"{mode} {result[mode] * 1e3:7.2f} ms" for mode in MODES),
                flush=True,
            )
    finally:
        server.stop()
    if not args.rounds:
        return
    off = statistics.median(medians["off"])
    print(
        f"\njob: {args.stages} stages, {args.schedule}, m={args.microbatches}, hidden={args.hidden}, "
        f"{args.steps} steps/run (first {WARMUP_STEPS} dropped), {args.rounds} interleaved rounds"
    )
    print(f"median step time off: {off * 1e3:.2f} ms")
    targets = {"defaults": "<= 1.01", "full": "<= 1.03", "profiler": "(reference)"}
    for mode, values in ratios.items():
        print(
            f"{mode:9s} median paired ratio {statistics.median(values):.4f}  "
            f"ratio of medians {statistics.median(medians[mode]) / off:.4f}  target {targets[mode]}"
        )
    span_ns, wrapper_ns = training_thread_cost_per_span(workdir)
    spans_per_step = 4 * args.microbatches + 3
    bound = spans_per_step * max(span_ns, wrapper_ns) / (off * 1e9)
    print(
        f"training-thread cost: collector.span {span_ns:.0f} ns/span, pipelining wrapper {wrapper_ns:.0f} ns/span; "
        f"{spans_per_step} spans/step -> {100 * bound:.3f}% of the {off * 1e3:.1f} ms step"
    )


if __name__ == "__main__":
    main()
