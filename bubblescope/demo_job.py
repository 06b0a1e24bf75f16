"""The demo's training job: a multi-layer MLP pipelined over every rank with torch.distributed.pipelining.

Run under torchrun (gloo, CPU), one pipeline stage per rank::

    torchrun --standalone --nproc-per-node 4 -m bubblescope.demo_job --schedule 1f1b --microbatches 8
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage

from bubblescope import collector
from bubblescope.pipeline_layout import SCHEDULES, build_schedule, local_stage_indices


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--schedule", choices=sorted(SCHEDULES) + ["naive"], default="1f1b",
                        help="naive: layer-wise model parallelism, no micro-batches (use --microbatches 1)")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers-per-stage", type=int, default=2)
    parser.add_argument("--layers", type=parse_layer_split, default=None,
                        help="layers of each (virtual) stage, e.g. 3,1 (overrides --layers-per-stage)")
    parser.add_argument("--stages-per-rank", type=int, default=None,
                        help="virtual stages per rank (default: 1 for gpipe/1f1b, 2 otherwise)")
    parser.add_argument("--microbatch-size", type=int, default=32)
    parser.add_argument("--run", default=None, help="run name (default demo-<schedule>)")
    parser.add_argument("--no-collector", action="store_true", help="train without bubblescope")
    parser.add_argument("--torch-profiler", action="store_true",
                        help="record the whole job with torch.profiler (CPU activities) instead")
    return parser.parse_args(argv)


def parse_layer_split(text: str) -> list[int]:
    try:
        layers = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--layers: expected comma-separated integers, got {text!r}") from None
    if not layers or min(layers) < 1:
        raise argparse.ArgumentTypeError(f"--layers: every stage needs at least 1 layer, got {text!r}")
    return layers


def layer_split(args: argparse.Namespace, num_stages: int) -> list[int]:
    """Layers of every (virtual) stage: ``--layers`` or ``--layers-per-stage`` each."""
    if args.layers is None:
        return [args.layers_per_stage] * num_stages
    if len(args.layers) != num_stages:
        raise SystemExit(f"--layers: {num_stages} stages need {num_stages} counts, got {len(args.layers)}")
    return args.layers


def build_stage_module(hidden: int, layers: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(hidden, hidden), nn.GELU()]
    return nn.Sequential(*blocks)


def clip_grad_norm_across_stages(parameters: list[torch.nn.Parameter], max_norm: float) -> float:
    """Global gradient-norm clipping over every pipeline stage, as real trainers do.

    The all-reduce of the squared norm also ends every rank's step together, as in training.
    """
    squared = torch.zeros(1)
    for parameter in parameters:
        if parameter.grad is not None:
            squared += parameter.grad.detach().pow(2).sum()
    with collector.span("all_reduce", group="pp", name="grad_norm", bytes=squared.element_size()):
        dist.all_reduce(squared)
    norm = float(squared.sqrt())
    if norm > max_norm:
        for parameter in parameters:
            if parameter.grad is not None:
                parameter.grad.mul_(max_norm / (norm + 1e-6))
    return norm


def run_steps(args: argparse.Namespace, parameters: list[torch.nn.Parameter],
              forward_backward: Callable[[torch.Tensor, torch.Tensor], None]) -> list[float]:
    """The training loop every mode shares: data, ``forward_backward``, clipping, optimizer; step times in s."""
    optimizer = torch.optim.SGD(parameters, lr=1e-3)
    batch_size = args.microbatches * args.microbatch_size
    generator = torch.Generator().manual_seed(1234)
    step_times: list[float] = []
    for _ in range(args.steps):
        started = time.perf_counter()
        with collector.step():
            with collector.span("data_loading"):
                inputs = torch.randn(batch_size, args.hidden, generator=generator)
                targets = torch.randn(batch_size, args.hidden, generator=generator)
            optimizer.zero_grad(set_to_none=True)
            forward_backward(inputs, targets)
            clip_grad_norm_across_stages(parameters, max_norm=1.0)
            with collector.span("optimizer"):
                optimizer.step()
        step_times.append(time.perf_counter() - started)
    return step_times


def train_naive(args: argparse.Namespace) -> list[float]:
    """Layer-wise model parallelism: the whole batch goes through rank 0, then rank 1, ... and back."""
    rank, world = dist.get_rank(), dist.get_world_size()
    module = build_stage_module(args.hidden, layer_split(args, world)[rank], seed=rank)
    stage = collector.LayerwiseStage(stage=rank, num_stages=world)

    def forward_backward(inputs: torch.Tensor, targets: torch.Tensor) -> None:
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


def train(args: argparse.Namespace) -> list[float]:
    """Train ``args.steps`` steps; returns each step's wall time in seconds (rank-local)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.schedule == "naive":
        return train_naive(args)
    indices = local_stage_indices(args.schedule, rank, world, args.stages_per_rank)
    num_stages = world * len(indices)
    layers = layer_split(args, num_stages)
    stages = [
        PipelineStage(
            build_stage_module(args.hidden, layers[index], seed=index),
            stage_index=index,
            num_stages=num_stages,
            device=torch.device("cpu"),
        )
        for index in indices
    ]
    schedule = build_schedule(args.schedule, stages, args.microbatches, nn.functional.mse_loss)
    collector.instrument(schedule)
    holds_first, holds_last = 0 in indices, num_stages - 1 in indices

    def forward_backward(inputs: torch.Tensor, targets: torch.Tensor) -> None:
        if holds_first and holds_last:
            schedule.step(inputs, target=targets)
        elif holds_first:
            schedule.step(inputs)
        elif holds_last:
            schedule.step(target=targets)
        else:
            schedule.step()

    return run_steps(args, [p for stage in stages for p in stage.submod.parameters()], forward_backward)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(int(os.environ.get("BUBBLESCOPE_DEMO_THREADS", "1")))
    dist.init_process_group("gloo")
    if not args.no_collector:
        collector.init(
            run=args.run or f"demo-{args.schedule}",
            # A short demo: full spans of every step unless BUBBLESCOPE_FULL_SPANS_EVERY says otherwise.
            full_spans_every=None if os.environ.get("BUBBLESCOPE_FULL_SPANS_EVERY") else 1,
            config={
                "model": "mlp",
                "hidden": args.hidden,
                "layers_per_stage": args.layers or args.layers_per_stage,
                "microbatch_size": args.microbatch_size,
                "global_batch": args.microbatches * args.microbatch_size,
            },
        )
    if args.torch_profiler:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], record_shapes=False):
            step_times = train(args)
    else:
        step_times = train(args)
    collector.shutdown()
    if dist.get_rank() == 0:
        out = os.environ.get("BUBBLESCOPE_DEMO_TIMES")
        if out:
            with open(out, "w") as handle:
                handle.write("\n".join(f"{t:.6f}" for t in step_times))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
