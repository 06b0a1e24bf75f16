"""A plain data-parallel training loop, instrumented as docs/collector.md shows and nothing more: DDP over
gloo, an MLP, a DataLoader. For the benches that need a job written the way a user writes one
(``bench/api_answers.py record``)::

    BUBBLESCOPE_URL=http://127.0.0.1:8765 torchrun --standalone --nproc-per-node 2 bench/ddp_from_docs.py --run-name ddp-docs
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from bubblescope import collector


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run-name", required=True, help="the run key (not --run: torchrun takes it for --run-path)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=512)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    collector.init(run=args.run_name)
    torch.manual_seed(0)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(args.hidden, args.hidden), nn.GELU(), nn.Linear(args.hidden, args.hidden))
    )
    collector.instrument_ddp(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    collector.instrument_optimizer(optimizer)
    data = TensorDataset(torch.randn(64 * args.steps, args.hidden), torch.randn(64 * args.steps, args.hidden))
    loader = DataLoader(data, batch_size=64 // dist.get_world_size(), sampler=DistributedSampler(data))
    for inputs, targets in collector.timed_batches(loader):
        with collector.step():
            optimizer.zero_grad()
            nn.functional.mse_loss(model(inputs), targets).backward()
            optimizer.step()
    collector.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
