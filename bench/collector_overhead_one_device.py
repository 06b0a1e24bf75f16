"""Collector overhead on one device: a DDP training step in a world of one, with and without it.

The pipeline benchmark (``collector_overhead.py``) needs one process per stage and so, on GPUs,
one GPU per stage. This one runs wherever there is one device: a data-parallel step (DDP over a
world of one: NCCL on a CUDA GPU, gloo on the CPU) of an MLP, with the collector as a DDP job
uses it: ``instrument_ddp`` (a span per gradient bucket, and the model's forward and backward from
its hooks: ``instrument_model``, CUDA events on a GPU), ``instrument_optimizer``, every collective
traced, per-step aggregates, full spans every N-th step, the shipper sending to a stand-in
service in its own process (``answer_only_service.py``). On a GPU this is the CUDA-event path.

Within one process, blocks of ``--block`` steps take turns in ABBA order: collected, and inside
``collector.paused()`` (the baseline: the same model, DDP and optimizer; the hooks pass straight
through). Each step ends with ``loss.item()``, which waits for the device, as a training loop
that logs its loss does; the step's wall time is what the job pays. The figure is the median over
block pairs of (median collected step / median baseline step), with a 95% bootstrap interval,
and the ratio of total step times. The shipper thread's CPU per collected step is reported as a
share of the step (it flushes on its own clock, so its work lands on both kinds of step).

    python bench/collector_overhead_one_device.py [--device auto|cpu|cuda] [--steps 600] [--block 10]
        [--width 2048] [--layers 8] [--batch 64] [--bucket-mb 8] [--full] [--phases] [--profile]

``--phases`` prints each phase's median host time (forward, backward, optimizer, the wait for the device, the
step's end) for both kinds of step; ``--profile`` runs cProfile on the training thread, one profile for the
collected steps and one for the baseline, and prints the functions whose time per step differs most.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import itertools
import os
import pstats
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from bench.answer_only_service import start_answer_only
from bench.stats import median_interval
from bubblescope import collector
from bubblescope.thread_cpu import named_thread_cpu_s

WARMUP_STEPS = 10


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--steps", type=int, default=600, help="measured steps, after the warm-up")
    parser.add_argument("--block", type=int, default=10, help="steps per block (ABBA)")
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--bucket-mb", type=float, default=8.0, help="DDP bucket_cap_mb")
    parser.add_argument("--full", action="store_true", help="full spans every step (else the defaults)")
    parser.add_argument("--phases", action="store_true", help="each phase's median host time, both kinds of step")
    parser.add_argument(
        "--profile", action="store_true", help="cProfile of both kinds of step, the largest differences"
    )
    args = parser.parse_args()
    if args.steps < 4 * args.block or args.block < 1:
        parser.error("--steps: need at least two ABBA rounds (4 × --block)")
    return args


def world_of_one(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", rank=0, world_size=1, store=dist.HashStore(), device_id=device)
    else:
        dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())


def collected_step(index: int, block: int) -> bool:
    """ABBA: collected, baseline; baseline, collected; ... (what a block leaves to the next, the
    shipper's sends, falls on both kinds alike)."""
    return (index // block) % 2 == (index // (2 * block)) % 2


PHASES = ("forward", "backward", "optimizer", "device wait", "step end")


class Diagnostics:
    """``--phases`` and ``--profile``: each phase's host time and a cProfile per kind of step."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.phases: dict[bool, list[list[float]]] = {True: [], False: []}
        self.profiles = {kind: cProfile.Profile() for kind in (True, False)} if args.profile else None
        self.steps = {True: 0, False: 0}

    def start(self, collected: bool) -> None:
        if self.profiles is not None:
            self.profiles[collected].enable()

    def stop(self, collected: bool, marks: list[float]) -> None:
        if self.profiles is not None:
            self.profiles[collected].disable()
        self.steps[collected] += 1
        self.phases[collected].append([later - earlier for earlier, later in itertools.pairwise(marks)])

    def print(self) -> None:
        if self.phases[True]:
            print("phase (median host ms)   collected  baseline")
            for index, phase in enumerate(PHASES):
                collected, baseline = (
                    statistics.median(p[index] for p in self.phases[kind]) * 1e3 for kind in (True, False)
                )
                print(f"  {phase:<22} {collected:9.3f} {baseline:9.3f}")
        if self.profiles is None:
            return
        per_step: dict[bool, dict[str, float]] = {}
        for kind, profile in self.profiles.items():
            stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
            per_step[kind] = {
                f"{Path(file).name}:{line}({name})": total / max(1, self.steps[kind])
                for (file, line, name), (_cc, _nc, total, _cum, _callers) in stats.items()
            }
        names = set(per_step[True]) | set(per_step[False])
        differences = sorted(names, key=lambda n: per_step[True].get(n, 0) - per_step[False].get(n, 0), reverse=True)
        print("cProfile, own time per step (µs), largest excess of collected over baseline:")
        for name in differences[:30]:
            print(f"  {per_step[True].get(name, 0) * 1e6:9.1f} {per_step[False].get(name, 0) * 1e6:9.1f}  {name}")


def run(
    args: argparse.Namespace, device: torch.device, diagnostics: Diagnostics
) -> tuple[list[tuple[bool, float]], float]:
    """Step wall times (collected?, seconds) after the warm-up, and the shipper thread's CPU seconds."""
    torch.manual_seed(0)
    layers = [module for _ in range(args.layers) for module in (nn.Linear(args.width, args.width), nn.GELU())]
    model = DistributedDataParallel(nn.Sequential(*layers).to(device), bucket_cap_mb=args.bucket_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    collector.instrument_ddp(model)
    collector.instrument_optimizer(optimizer)
    inputs = torch.randn(args.batch, args.width, device=device)
    targets = torch.randn(args.batch, args.width, device=device)
    timings: list[tuple[bool, float]] = []
    shipper_before = named_thread_cpu_s("bubblescope-shipper") or 0.0
    clock = time.perf_counter
    for index in range(-WARMUP_STEPS, args.steps):
        collected = index < 0 or collected_step(index, args.block)
        if index >= 0:
            diagnostics.start(collected)
        started = clock()
        marks = [started]
        with contextlib.nullcontext() if collected else collector.paused(), collector.step():
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(inputs), targets)
            marks.append(clock())
            loss.backward()
            marks.append(clock())
            optimizer.step()
            marks.append(clock())
            loss.item()  # waits for the device, as logging the loss does
            marks.append(clock())
        marks.append(clock())
        if index >= 0:
            timings.append((collected, marks[-1] - started))
            diagnostics.stop(collected, marks)
    shipper_s = (named_thread_cpu_s("bubblescope-shipper") or 0.0) - shipper_before
    return timings, shipper_s


def report(args: argparse.Namespace, device: torch.device, timings: list[tuple[bool, float]], shipper_s: float) -> None:
    pairs: list[float] = []
    for start in range(0, len(timings) - 2 * args.block + 1, 2 * args.block):
        pair = timings[start : start + 2 * args.block]
        collected = [t for c, t in pair if c]
        baseline = [t for c, t in pair if not c]
        pairs.append(statistics.median(collected) / statistics.median(baseline))
    collected_all = [t for c, t in timings if c]
    baseline_all = [t for c, t in timings if not c]
    low, high = median_interval(pairs)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({os.cpu_count()} cores)"
    mode = "full capture" if args.full else "defaults"
    print(
        f"device: {name}; torch {torch.__version__}; DDP world of one, {args.layers}×Linear({args.width}), "
        f"batch {args.batch}, buckets of {args.bucket_mb} MB; collector at {mode}"
    )
    print(
        f"steps: {len(collected_all)} collected, {len(baseline_all)} baseline, blocks of {args.block} (ABBA); "
        f"median step {statistics.median(collected_all) * 1e3:.3f} ms collected, "
        f"{statistics.median(baseline_all) * 1e3:.3f} ms baseline"
    )
    print(
        f"step-time ratio (median of {len(pairs)} block pairs): {statistics.median(pairs):.4f} "
        f"(95% CI {low:.4f}–{high:.4f}); ratio of totals {sum(collected_all) / sum(baseline_all):.4f}"
    )
    print(
        f"shipper thread: {shipper_s * 1e3 / max(1, len(collected_all)):.3f} ms CPU per collected step "
        f"({shipper_s / max(1e-9, sum(collected_all)):.2%} of their time)"
    )


def main() -> None:
    args = parse_args()
    wanted = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    device = torch.device("cuda:0" if wanted == "cuda" else "cpu")
    workdir = Path(tempfile.mkdtemp(prefix="bubblescope-one-device-"))
    service = start_answer_only(workdir)
    try:
        world_of_one(device)
        collector.init(
            "bench-one-device",
            url=service.url,
            run_key=f"one-device-{uuid.uuid4().hex[:8]}",
            spool_dir=workdir / "spool",
            full_spans_every=1 if args.full else None,
        )
        if not collector.is_enabled():
            raise SystemExit("the collector did not start (BUBBLESCOPE_DISABLED set?)")
        diagnostics = Diagnostics(args)
        timings, shipper_s = run(args, device, diagnostics)
        collector.shutdown()
        report(args, device, timings, shipper_s)
        diagnostics.print()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        service.process.kill()


if __name__ == "__main__":
    main()
