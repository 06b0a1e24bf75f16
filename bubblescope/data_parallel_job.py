"""The tour's data-parallel job (``bubblescope demo --tour``): an MLP trained with DDP or FSDP2 and no pipeline,
instrumented exactly as docs/collector.md's snippet says and nothing more. Run under torchrun (gloo, CPU)::

    torchrun --standalone --nproc-per-node 2 -m bubblescope.data_parallel_job --mode ddp

``--late-rank R --late-ms M``: rank R also spends M ms a step on the host between forward and backward (a
slow data transform, a logging call), so that its peers wait for it in the gradient all-reduce.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bubblescope import collector
from bubblescope.collector.config import env_setting


def build_model(mode: str, width: int, layers: int) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(layers)])
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ddp: nn.Module = collector.instrument_ddp(DistributedDataParallel(model))
        return ddp
    from torch.distributed.fsdp import fully_shard

    for block in model:
        fully_shard(block)
    sharded: nn.Module = collector.instrument_model(fully_shard(model))
    return sharded


def batches(steps: int, batch: int, width: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(dist.get_rank())
    return [(torch.randn(batch, width, generator=generator), torch.randn(batch, width, generator=generator))] * steps


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("ddp", "fsdp2"), default="ddp")
    parser.add_argument("--run-name", default=None, help="run name (default: BUBBLESCOPE_RUN, else the mode)")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--late-rank", type=int, default=None, help="this rank spends --late-ms on the host a step")
    parser.add_argument("--late-ms", type=float, default=0.0)
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    collector.init(run=args.run_name or env_setting("run_name") or args.mode)
    model = build_model(args.mode, args.width, args.layers)
    optimizer = collector.instrument_optimizer(torch.optim.SGD(model.parameters(), lr=1e-3))
    late = dist.get_rank() == args.late_rank
    for inputs, targets in collector.timed_batches(batches(args.steps, args.batch, args.width)):
        with collector.step():
            optimizer.zero_grad()
            loss: Any = nn.functional.mse_loss(model(inputs), targets)  # torch's backward() is untyped
            if late:  # host work outside the model: the others wait for it in the all-reduce
                time.sleep(args.late_ms / 1e3)
            loss.backward()
            optimizer.step()
    collector.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
