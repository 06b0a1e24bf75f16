"""A small data-parallel job with stragglers on demand, for the stragglers tests.

Run under torchrun (gloo, CPU)::

    torchrun --standalone --nproc-per-node 4 tests/stragglers/straggler_job.py \\
        --hosts=hA,hA,hB,hB --slow=3:1.6 --slow=1:2.5@4-5

Each step: a forward span holding a small MLP's forward plus ``--device-ms`` of simulated device
time (a sleep: on a shared 2-core machine, real extra work on one rank would slow the others
too), a backward span, then the gradients all-reduced by hand over the data-parallel group. The
all-reduce comes after backward, so the ranks that wait for a straggler wait inside it (exposed
communication), as they do on GPUs where NCCL runs on its own stream; with gloo, DDP's bucket
wait would block inside ``backward()`` and be timed as compute.

``--slow=RANK:FACTOR`` makes that rank's device time FACTOR times longer on every step;
``--slow=RANK:FACTOR@A-B`` only on steps A..B. ``--hosts`` names each rank's host (through
``BUBBLESCOPE_HOSTNAME``), so one machine can play several.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn

from bubblescope import collector

HIDDEN = 64


def slowdown(specs: list[str], rank: int, step: int) -> float:
    """The factor that ``--slow`` specs put on ``rank`` at ``step`` (1.0: none)."""
    factor = 1.0
    for spec in specs:
        who, _, rest = spec.partition(":")
        value, _, steps = rest.partition("@")
        first, _, last = steps.partition("-")
        if int(who) == rank and (not steps or int(first) <= step <= int(last or first)):
            factor *= float(value)
    return factor


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, args: argparse.Namespace, factor: float) -> None:
    x = torch.randn(args.batch, HIDDEN)
    with collector.span("forward"):
        loss = model(x).pow(2).mean()
        time.sleep(args.device_ms * factor / 1000)
    with collector.span("backward"):
        loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()
    optimizer.step()
    optimizer.zero_grad()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--device-ms", type=float, default=50.0, help="simulated device time per step")
    parser.add_argument("--hosts", default="", help="comma-separated host name of each rank")
    parser.add_argument("--slow", action="append", default=[], help="RANK:FACTOR or RANK:FACTOR@A-B")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    hosts = [h for h in args.hosts.split(",") if h]
    if hosts:
        os.environ["BUBBLESCOPE_HOSTNAME"] = hosts[rank]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    train_step(model, optimizer, args, 1.0)  # warm-up, not measured: first calls pay lazy setup
    collector.init(run="stragglers", full_spans_every=5)
    for step in range(args.steps):
        with collector.step():
            train_step(model, optimizer, args, slowdown(args.slow, rank, step))
    collector.shutdown()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
