"""A small 1F1B pipeline with delays injected where the analysis should find them (tests only).

Run under torchrun (gloo, CPU), one stage per rank::

    torchrun --standalone --nproc-per-node 4 tests/analysis/injected_job.py \\
        --slow-stage 2:30 --pause 0:100:7,9 --late 3:60:12,13

- ``--slow-stage S:MS``: stage S's module sleeps MS milliseconds in every forward (a forward
  span of that stage, MS longer: the stage is slower, the others wait for it);
- ``--pause RANK:MS:STEPS``: on the listed steps that rank sleeps MS milliseconds at the step's
  start, inside ``collector.step()`` but in no span (idle on that rank; the ranks downstream
  wait in their recvs for it: dependency wait);
- ``--late RANK:MS:STEPS``: on the listed steps that rank computes MS milliseconds more (an
  ``optimizer`` span) before the step's closing all-reduce (compute on that rank; the others wait
  for it inside the all-reduce: dependency wait, not transfer).

The layers are tiny (``--hidden`` 32), so each action's own cost (about a millisecond of the
pipelining runtime on this CPU) stays small beside the injected delays. Every step ends with a
one-element all-reduce, so that the ranks start each step together, as in training.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from bubblescope import collector


class Sleepy(nn.Module):
    """``inner``, after sleeping ``seconds`` in each forward (autograd's backward does not call it)."""

    def __init__(self, inner: nn.Module, seconds: float) -> None:
        super().__init__()
        self.inner = inner
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.seconds:
            time.sleep(self.seconds)
        return self.inner(x)


def parse_pair(text: str) -> tuple[int, float]:
    rank, ms = text.split(":")
    return int(rank), float(ms)


def parse_pause(text: str) -> tuple[int, float, set[int]]:
    rank, ms, steps = text.split(":")
    return int(rank), float(ms), {int(step) for step in steps.split(",")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--microbatch-size", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--slow-stage", type=parse_pair, default=None, metavar="STAGE:MS")
    parser.add_argument("--pause", type=parse_pause, default=None, metavar="RANK:MS:STEP,STEP")
    parser.add_argument("--late", type=parse_pause, default=None, metavar="RANK:MS:STEP,STEP")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    collector.init(
        run="injected",
        full_spans_every=1,
        config={"microbatch_size": args.microbatch_size, "global_batch": args.microbatches * args.microbatch_size},
    )
    torch.manual_seed(rank)
    delay_s = args.slow_stage[1] / 1e3 if args.slow_stage and args.slow_stage[0] == rank else 0.0
    module = Sleepy(nn.Sequential(nn.Linear(args.hidden, args.hidden), nn.ReLU()), delay_s)
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    schedule = collector.instrument(
        Schedule1F1B(stage, n_microbatches=args.microbatches, loss_fn=nn.functional.mse_loss)
    )
    batch = args.microbatches * args.microbatch_size
    generator = torch.Generator().manual_seed(0)
    for step in range(args.steps):
        inputs = torch.randn(batch, args.hidden, generator=generator)
        targets = torch.randn(batch, args.hidden, generator=generator)
        with collector.step():
            if args.pause and args.pause[0] == rank and step in args.pause[2]:
                time.sleep(args.pause[1] / 1e3)
            if rank == 0:
                schedule.step(inputs)
            elif rank == world - 1:
                schedule.step(target=targets)
            else:
                schedule.step()
            if args.late and args.late[0] == rank and step in args.late[2]:
                with collector.span("optimizer"):
                    time.sleep(args.late[1] / 1e3)
            dist.all_reduce(torch.zeros(1))
    collector.shutdown()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
