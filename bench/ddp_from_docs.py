"""A plain data-parallel training loop, instrumented as docs/collector.md shows and nothing more: DDP over
gloo, an MLP, a DataLoader. For the benches that need a job written the way a user writes one
(``bench/api_answers.py record``)::

    BUBBLESCOPE_URL=http://127.0.0.1:8765 torchrun --standalone --nproc-per-node 2 bench/ddp_from_docs.py --run-name ddp-docs

With ``--cuda`` the same loop runs as a GPU job is written: NCCL, each rank on the GPU of its LOCAL_RANK. With
``--fsdp2`` the model is sharded instead (``fully_shard`` on each layer and the root, ``instrument_model``).
With ``--trace-dir`` it is also profiled by torch.profiler (a few steps, a Kineto trace per rank), as a
user profiles a job: the README's GPU checks run both, so one real GPU job is collected and traced.
"""

from __future__ import annotations

import argparse
import os
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ProfilerActivity, profile, schedule
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from bubblescope import collector


def profiled(trace_dir: str | None, rank: int, cuda: bool) -> AbstractContextManager[Any]:
    """torch.profiler over steps 4-7 (after a wait and a warm-up), written as ``rank{N}.json``; or nothing."""
    if trace_dir is None:
        return nullcontext()
    os.makedirs(trace_dir, exist_ok=True)
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    return profile(
        activities=activities,
        schedule=schedule(wait=2, warmup=2, active=4, repeat=1),
        on_trace_ready=lambda prof: prof.export_chrome_trace(f"{trace_dir}/rank{rank}.json"),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run-name", required=True, help="the run key (not --run: torchrun takes it for --run-path)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--cuda", action="store_true", help="NCCL, each rank on the GPU of its LOCAL_RANK")
    parser.add_argument("--fsdp2", action="store_true", help="fully_shard instead of DDP")
    parser.add_argument("--trace-dir", help="also profile steps 4-7 with torch.profiler, one trace per rank here")
    args = parser.parse_args()

    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if args.cuda else torch.device("cpu")
    if args.cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if args.cuda else "gloo")
    collector.init(run=args.run_name)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(args.hidden, args.hidden), nn.GELU(), nn.Linear(args.hidden, args.hidden)).to(
        device
    )
    if args.fsdp2:
        from torch.distributed.fsdp import fully_shard

        for layer in (model[0], model[2]):
            fully_shard(layer)
        model = collector.instrument_model(fully_shard(model))
    else:
        model = DistributedDataParallel(model)
        collector.instrument_ddp(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    collector.instrument_optimizer(optimizer)
    data = TensorDataset(torch.randn(64 * args.steps, args.hidden), torch.randn(64 * args.steps, args.hidden))
    loader = DataLoader(data, batch_size=64 // dist.get_world_size(), sampler=DistributedSampler(data))
    with profiled(args.trace_dir, dist.get_rank(), args.cuda) as profiler:
        for inputs, targets in collector.timed_batches(loader):
            with collector.step():
                optimizer.zero_grad()
                loss = nn.functional.mse_loss(model(inputs.to(device)), targets.to(device))
                loss.backward()
                optimizer.step()
                loss.item()
            if profiler is not None:
                profiler.step()
    collector.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
