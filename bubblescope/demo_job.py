"""The demo's training job: a multi-layer MLP pipelined over every rank with torch.distributed.pipelining.

Run under torchrun (gloo, CPU), one pipeline stage per rank::

    torchrun --standalone --nproc-per-node 4 -m bubblescope.demo_job --schedule 1f1b --microbatches 8
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage

from bubblescope import collector, wire
from bubblescope.analysis import DEFAULT_SCHEDULE, NAIVE, NAMES, Schedule, ScheduleError, lookup
from bubblescope.cli import schedule_argument
from bubblescope.collector.config import env_setting
from bubblescope.demo_faults import Fault, add_fault_options
from bubblescope.thread_cpu import named_thread_cpu_s

DEFAULT_HIDDEN = 512
DEFAULT_BATCH_SIZE = 256
"""Samples per step, held whatever the micro-batching: 8 micro-batches of 32 by default, and one of
256 for the naive split, whose stage work then outweighs the per-action overheads of a CPU, as a GPU
job's would."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.microbatch_size is None:
        args.microbatch_size = max(1, args.batch_size // max(1, args.microbatches))
    return args


def build_parser() -> argparse.ArgumentParser:
    # No option may be a prefix of two of torchrun's: torchrun's parser reads past the module name
    # and refuses an ambiguous abbreviation (hence --run-name, not --run, which --run-path shares).
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--schedule",
        type=schedule_argument,
        default=DEFAULT_SCHEDULE.name,
        metavar="|".join(NAMES),
        help="any of these or torch's class name; naive: layer-wise model parallelism, no "
        "micro-batches (use --microbatches 1)",
    )
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=DEFAULT_HIDDEN)
    parser.add_argument("--layers-per-stage", type=int, default=2)
    parser.add_argument(
        "--layers",
        type=parse_layer_split,
        default=None,
        help="layers of each (virtual) stage, e.g. 3,1 (overrides --layers-per-stage)",
    )
    parser.add_argument(
        "--stages-per-rank",
        type=int,
        default=None,
        help="virtual stages per rank (default: 1 for gpipe/1f1b, 2 otherwise)",
    )
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=DEFAULT_BATCH_SIZE,
        help="samples per step, split into the micro-batches (default: %(default)s)",
    )
    parser.add_argument(
        "--microbatch-size", type=positive_int, default=None, help="samples per micro-batch (overrides --batch-size)"
    )
    parser.add_argument("--run-name", default=None, help="run name (default: BUBBLESCOPE_RUN, else demo-<schedule>)")
    parser.add_argument("--run", action=_Renamed, nargs="?", help=argparse.SUPPRESS)
    parser.add_argument("--url", default=None, help="the service to stream into (default: BUBBLESCOPE_URL)")
    parser.add_argument(
        "--full-spans-every",
        type=positive_int,
        default=None,
        metavar="N",
        help="full spans of every N-th step, aggregates of the others (default: BUBBLESCOPE_FULL_SPANS_EVERY, "
        "else 1, every step: the demo is short)",
    )
    parser.add_argument(
        "--device-ms",
        type=float,
        default=0.0,
        metavar="MS",
        help="each layer also waits MS ms forward and 2·MS backward per micro-batch, asleep, as on a GPU: more "
        "ranks than cores then still run side by side (default: %(default)s, none)",
    )
    parser.add_argument(
        "--dp",
        type=positive_int,
        default=1,
        help="data-parallel replicas of the pipeline (a dp × pp DeviceMesh; the gradients all-reduced over dp) "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--threads", type=positive_int, default=1, help="torch's intra-op threads (default: %(default)s)"
    )
    parser.add_argument(
        "--times-file",
        default=None,
        metavar="PATH",
        help="rank 0 writes its step times there (with --ab-block: a JSON document with CPU times)",
    )
    parser.add_argument("--no-collector", action="store_true", help="train without bubblescope")
    parser.add_argument(
        "--torch-profiler",
        action="store_true",
        help="record the whole job with torch.profiler (CPU activities) instead",
    )
    parser.add_argument(
        "--ab-block",
        type=int,
        default=0,
        metavar="K",
        help="overhead benchmark: alternate blocks of K steps with the collector and K "
        "steps without it (the same stages under an uninstrumented schedule, inside "
        "collector.paused()); not for --schedule naive",
    )
    add_fault_options(parser)
    return parser


class _Renamed(argparse.Action):
    """The old ``--run``: an error that names the new spelling (under torchrun, torchrun's own
    parser refuses ``--run`` before this job starts)."""

    def __call__(self, parser: argparse.ArgumentParser, *_args: Any, **_kwargs: Any) -> None:
        parser.error("--run is now --run-name (torchrun takes --run for its --run-path)")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def run_name(args: argparse.Namespace) -> str:
    """``--run-name``, else ``BUBBLESCOPE_RUN``, else ``demo-<schedule>``."""
    return args.run_name or env_setting("run_name") or f"demo-{args.schedule}"


def build_schedule(schedule: Schedule, stages: list[Any], microbatches: int, loss_fn: Callable[..., Any]) -> Any:
    """The torch.distributed.pipelining schedule object for this rank's ``stages``."""
    from torch.distributed import pipelining

    schedule_class = getattr(pipelining.schedules, str(schedule.torch_class))
    if schedule.placement == "single":
        return schedule_class(stages[0], n_microbatches=microbatches, loss_fn=loss_fn)
    return schedule_class(stages, n_microbatches=microbatches, loss_fn=loss_fn)


def parse_layer_split(text: str) -> list[int]:
    try:
        layers = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--layers: expected comma-separated integers, got {text!r}") from None
    if not layers or min(layers) < 1:
        raise argparse.ArgumentTypeError(f"--layers: every stage needs at least 1 layer, got {text!r}")
    return layers


def layer_split(layers: list[int] | None, layers_per_stage: int, num_stages: int) -> list[int]:
    """Layers of every (virtual) stage: ``layers`` (``--layers``), else ``layers_per_stage`` each."""
    if layers is None:
        return [layers_per_stage] * num_stages
    if len(layers) != num_stages:
        raise SystemExit(f"--layers: {num_stages} stages need {num_stages} counts, got {len(layers)}")
    return list(layers)


class _DeviceTime(torch.autograd.Function):
    """Waits as the CPU waits on a GPU kernel: ``seconds`` forward, twice that backward, asleep."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, seconds: float) -> torch.Tensor:
        ctx.seconds = seconds
        time.sleep(seconds)
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(2 * ctx.seconds)
        return grad, None


class DeviceTime(nn.Module):
    """A layer's time on a device, without CPU work: ranks that share fewer cores than they are many still
    run their stages side by side, as ranks on GPUs do (``--device-ms``)."""

    def __init__(self, milliseconds: float) -> None:
        super().__init__()
        self.seconds = milliseconds / 1000

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _DeviceTime.apply(x, self.seconds)
        return out


def build_stage_module(hidden: int, layers: int, seed: int, device_ms: float = 0.0) -> nn.Module:
    torch.manual_seed(seed)
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(hidden, hidden), nn.GELU()]
        if device_ms > 0:
            blocks.append(DeviceTime(device_ms))
    return nn.Sequential(*blocks)


def clip_grad_norm_across_stages(parameters: list[torch.nn.Parameter], max_norm: float, replicas: int = 1) -> float:
    """Global gradient-norm clipping over every pipeline stage, as real trainers do.

    The all-reduce of the squared norm also ends every rank's step together, as in training. With ``replicas``
    data-parallel copies of the pipeline (their gradients already averaged), each stage's norm is summed once per
    copy, and divided back. It runs on
    the default group, and its span says so (``wire.WORLD_GROUP``), so that the analysis can tell the
    ranks that waited in it for the last one to arrive (a "pp" label, with no mesh registered, named a
    group it could not identify: their wait read as transfer).
    """
    squared = torch.zeros(1)
    for parameter in parameters:
        if parameter.grad is not None:
            squared += parameter.grad.detach().pow(2).sum()
    with collector.span("all_reduce", group=wire.WORLD_GROUP, name="grad_norm", bytes=squared.element_size()):
        dist.all_reduce(squared)
    norm = float((squared / replicas).sqrt())  # each of the ``replicas`` data-parallel copies counted once
    if norm > max_norm:
        for parameter in parameters:
            if parameter.grad is not None:
                parameter.grad.mul_(max_norm / (norm + 1e-6))
    return norm


@dataclass(frozen=True)
class StepTiming:
    wall_s: float
    cpu_s: float  # the training thread's CPU time
    collected: bool  # False: a baseline step of --ab-block, run with nothing recorded


ForwardBackward = Callable[[torch.Tensor, torch.Tensor, bool], None]


def run_steps(
    args: argparse.Namespace, parameters: list[torch.nn.Parameter], forward_backward: ForwardBackward
) -> list[StepTiming]:
    """The training loop every mode shares: data, ``forward_backward``, clipping, optimizer."""
    optimizer = torch.optim.SGD(parameters, lr=1e-3)
    batch_size = args.microbatches * args.microbatch_size
    replica = dist.get_rank() // (dist.get_world_size() // args.dp)  # a dp × pp mesh: rank = replica · pp + stage
    generator = torch.Generator().manual_seed(1234 + replica)  # each replica its own data, each stage alike
    timings: list[StepTiming] = []
    fault = Fault.for_rank(args, dist.get_rank(), dist.get_world_size())
    for index in range(args.steps):
        # --ab-block K: pairs of blocks, ABBA (with, without; without, with; ...) so that whatever
        # one block leaves to the next (the shipper's sends) falls on both sides alike
        collected = not args.ab_block or (index // args.ab_block) % 2 == (index // (2 * args.ab_block)) % 2
        started, started_cpu = time.perf_counter(), time.thread_time()
        with contextlib.nullcontext() if collected else collector.paused(), collector.step():
            with collector.span("data_loading"):
                inputs = torch.randn(batch_size, args.hidden, generator=generator)
                targets = torch.randn(batch_size, args.hidden, generator=generator)
                if fault is not None:
                    fault.in_data_loading(index)
            optimizer.zero_grad(set_to_none=True)
            if fault is not None:
                fault.before_pipeline(index)
            forward_backward(inputs, targets, collected)
            if fault is not None:
                fault.before_collective(index)
            clip_grad_norm_across_stages(parameters, max_norm=1.0, replicas=args.dp)
            with collector.span("optimizer"):
                optimizer.step()
        timings.append(StepTiming(time.perf_counter() - started, time.thread_time() - started_cpu, collected))
    return timings


def train_naive(args: argparse.Namespace) -> list[StepTiming]:
    """Layer-wise model parallelism: the whole batch goes through rank 0, then rank 1, ... and back."""
    rank, world = dist.get_rank(), dist.get_world_size()
    layers = layer_split(args.layers, args.layers_per_stage, world)[rank]
    module = build_stage_module(args.hidden, layers, seed=rank, device_ms=args.device_ms)
    stage = collector.LayerwiseStage(stage=rank, num_stages=world, module=module)

    def forward_backward(inputs: torch.Tensor, targets: torch.Tensor, _collected: bool) -> None:
        x = inputs.requires_grad_() if rank == 0 else stage.recv_activation(torch.empty_like(inputs))
        with stage.forward():
            y = module(x)
            loss = nn.functional.mse_loss(y, targets) if rank == world - 1 else None
        if loss is None:
            stage.send_activation(y)
            grad = stage.recv_gradient(torch.empty_like(y))
            with stage.backward():
                y.backward(grad)
        else:
            with stage.backward():
                loss.backward()
        if rank > 0:
            stage.send_gradient(x.grad)

    return run_steps(args, list(module.parameters()), forward_backward)


@dataclass(frozen=True)
class PipelinePart:
    """This rank's share of the pipelined model under one schedule: its stage modules, and how to
    build a torch schedule over them (the instrumented one, and an uninstrumented twin) and step it."""

    schedule: Schedule
    microbatches: int
    indices: list[int]
    num_stages: int
    modules: list[nn.Module]
    group: Any = None  # the pipeline's process group (a dp × pp mesh's "pp"); None: the default group

    @property
    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for module in self.modules for p in module.parameters()]

    def make_schedule(self) -> Any:
        stages = [
            PipelineStage(
                module, stage_index=index, num_stages=self.num_stages, device=torch.device("cpu"), group=self.group
            )
            for module, index in zip(self.modules, self.indices)
        ]
        return build_schedule(self.schedule, stages, self.microbatches, nn.functional.mse_loss)

    def step(self, run: Any, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        holds_first, holds_last = 0 in self.indices, self.num_stages - 1 in self.indices
        if holds_first and holds_last:
            run.step(inputs, target=targets)
        elif holds_first:
            run.step(inputs)
        elif holds_last:
            run.step(target=targets)
        else:
            run.step()


def pipeline_part(
    schedule_name: str,
    microbatches: int,
    layers: list[int] | None,
    layers_per_stage: int,
    args: argparse.Namespace,
    group: Any = None,
) -> PipelinePart:
    """This rank's stages of ``schedule_name`` with ``layers`` per (virtual) stage, or ``layers_per_stage`` each,
    over the ranks of ``group`` (default: every rank)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    schedule_kind = lookup(schedule_name)
    try:
        indices = schedule_kind.local_stages(rank, world, args.stages_per_rank)
    except ScheduleError as error:
        raise SystemExit(f"--stages-per-rank: {error.message}") from None
    num_stages = world * len(indices)
    split = layer_split(layers, layers_per_stage, num_stages)
    modules = [build_stage_module(args.hidden, split[index], seed=index, device_ms=args.device_ms) for index in indices]
    return PipelinePart(schedule_kind, microbatches, indices, num_stages, modules, group)


def replica_groups(dp: int) -> tuple[Any, Any]:
    """The (dp, pp) process groups of a dp × pp DeviceMesh (registered with the collector), or (None, None)."""
    if dp == 1:
        return None, None
    world = dist.get_world_size()
    if world % dp or world // dp < 2:
        raise SystemExit(f"--dp {dp}: {world} ranks do not split into {dp} replicas of at least 2 stages")
    from torch.distributed.device_mesh import init_device_mesh

    mesh = collector.register_mesh(init_device_mesh("cpu", (dp, world // dp), mesh_dim_names=("dp", "pp")))
    return mesh.get_group("dp"), mesh.get_group("pp")


def train(args: argparse.Namespace) -> list[StepTiming]:
    """Train ``args.steps`` steps; returns each step's timing (rank-local)."""
    if args.schedule == NAIVE.name:
        if args.dp > 1:
            raise SystemExit("--dp: needs a pipelining schedule, not --schedule naive")
        if args.ab_block:
            raise SystemExit("--ab-block: needs a pipelining schedule, not --schedule naive")
        return train_naive(args)
    dp_group, pp_group = replica_groups(args.dp)
    part = pipeline_part(args.schedule, args.microbatches, args.layers, args.layers_per_stage, args, pp_group)
    schedule = collector.instrument(part.make_schedule())
    plain_schedule = part.make_schedule() if args.ab_block else schedule  # the baseline: not instrumented

    def forward_backward(inputs: torch.Tensor, targets: torch.Tensor, collected: bool) -> None:
        part.step(schedule if collected else plain_schedule, inputs, targets)
        if dp_group is not None:  # data parallelism: each replica's gradients averaged over the replicas
            for parameter in part.parameters:
                if parameter.grad is not None:
                    dist.all_reduce(parameter.grad, group=dp_group)
                    parameter.grad.div_(args.dp)

    return run_steps(args, part.parameters, forward_backward)


def write_timings(path: str, timings: list[StepTiming], ab_block: int, shipper_s: float | None) -> None:
    """Rank 0's step times: one per line, or with --ab-block a JSON document with CPU times and modes."""
    with open(path, "w") as handle:
        if ab_block:
            json.dump({"steps": [asdict(t) for t in timings], "shipper_cpu_s": shipper_s}, handle)
        else:
            handle.write("\n".join(f"{t.wall_s:.6f}" for t in timings))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    if not args.no_collector:
        collector.init(
            run=run_name(args),
            url=args.url,
            full_spans_every=args.full_spans_every or env_setting("full_spans_every") or 1,
            config={
                "model": "mlp",
                "hidden": args.hidden,
                "microbatch_size": args.microbatch_size,
                "global_batch": args.dp * args.microbatches * args.microbatch_size,
            },
        )
    if args.torch_profiler:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], record_shapes=False):
            timings = train(args)
    else:
        timings = train(args)
    shipper_s = named_thread_cpu_s("bubblescope-shipper")
    collector.shutdown()
    if dist.get_rank() == 0 and args.times_file:
        write_timings(args.times_file, timings, args.ab_block, shipper_s)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
