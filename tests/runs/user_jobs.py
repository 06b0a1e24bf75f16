"""Training jobs written as users write them, each instrumented from docs/collector.md alone, run under
torchrun by ``tests/runs/test_user_jobs.py``:

- ``ddp``: a plain DDP MLP, instrumented exactly as the docs' first snippet says (``instrument_ddp``,
  ``instrument_optimizer``, ``timed_batches``, ``step``), nothing more;
- ``fsdp2``: ``fully_shard`` on each block and on the root, ``instrument_model`` on the root;
- ``tp``: tensor parallelism with DTensor (``parallelize_module`` over the "tp" mesh of a dp × tp mesh of
  1 × 2 on 2 ranks, 2 × 2 on 4, both dimensions registered as two meshes), ``instrument_model``; with dp > 1,
  DDP over the dp mesh (``DistributedDataParallel(model, device_mesh=...)``) and ``instrument_ddp``;
- ``hand``: no framework: the gradients all-reduced by hand after ``backward()``, ``instrument_model``;
- ``bare``: the hand loop without ``instrument_model``, as a job that missed it.

``--blocks``: the model's blocks priced one by one (``blocks=``); ``--heavy-block K``: block K of the MLP
runs four linear layers instead of one. ``--declare JSON``: keys the job adds to its run's config
(``collector.init(config=...)``), such as the model, cluster and layout the planner prices its fixes for.

``--loader-ms M --workers W``: each batch takes M ms to load, in W DataLoader worker processes (0: on the
training thread). ``--slow-rank R --slow-ms M``: rank R also spends M ms a step on the host between forward and
backward, so the other ranks wait for it in the gradient reduction. ``--alternate-from N``: from step N on, the
loading time and the slow rank's only on every other step (N + 1, N + 3, ...): the fault and its fix side by side.

Each rank times its own forward and backward with ``time.perf_counter`` (the job's own measurement the
service's figures are checked against) and writes them, with each step's wall time and its cycle (from the
previous step's end, its batch's loading included), to ``<report>.<rank>.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

from bubblescope import collector

HIDDEN = 512


def mlp(layers: int, heavy_block: int | None = None) -> nn.Sequential:
    torch.manual_seed(0)
    depth = [4 if index == heavy_block else 1 for index in range(layers)]
    return nn.Sequential(
        *[nn.Sequential(*[m for _ in range(n) for m in (nn.Linear(HIDDEN, HIDDEN), nn.GELU())]) for n in depth]
    )


def build(mode: str, layers: int, blocks: bool, heavy_block: int | None) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    model = mlp(layers, heavy_block)
    if mode == "ddp":
        return collector.instrument_ddp(DistributedDataParallel(model), blocks=model if blocks else None)
    if mode == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in model:
            fully_shard(block)
        return collector.instrument_model(fully_shard(model), blocks=model if blocks else None)
    if mode == "tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        size = dist.get_world_size()
        replicas = size // 2 if size >= 4 else 1
        world = init_device_mesh("cpu", (replicas, size // replicas), mesh_dim_names=("dp", "tp"))
        mesh = world["tp"]
        collector.register_mesh(world["dp"], mesh)  # several meshes, as a job that slices its own
        torch.manual_seed(0)
        model = nn.Sequential(
            *[
                nn.Sequential(nn.Linear(HIDDEN, 2 * HIDDEN), nn.GELU(), nn.Linear(2 * HIDDEN, HIDDEN))
                for _ in range(layers)
            ]
        )
        for block in model:
            parallelize_module(block, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        if replicas > 1:  # data parallel over dp: DDP on the tensor-parallel model
            ddp = DistributedDataParallel(model, device_mesh=world["dp"])
            return collector.instrument_ddp(ddp, blocks=model if blocks else None)
        return collector.instrument_model(model, blocks=model if blocks else None)
    if mode == "bare":  # the hand loop without instrument_model: only communication, data and optimizer spans
        return model
    return collector.instrument_model(model, blocks=model if blocks else None)  # hand


class SlowBatches(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Ready-made batches, each taking ``loader_ms`` to load (as a decoder or a remote read would)."""

    def __init__(self, steps: int, batch: int, loader_ms: float, faulty: Callable[[int], bool]) -> None:
        torch.manual_seed(1)
        self.batches = [(torch.randn(batch, HIDDEN), torch.randn(batch, HIDDEN)) for _ in range(steps)]
        self.loader_s = loader_ms / 1e3
        self.faulty = faulty

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.faulty(index):
            time.sleep(self.loader_s)
        return self.batches[index]


def all_reduce_gradients(model: nn.Module) -> None:
    """The hand loop's data parallelism: every gradient averaged over the ranks, after backward."""
    for parameter in model.parameters():
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad)
            parameter.grad /= dist.get_world_size()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["ddp", "fsdp2", "tp", "hand", "bare"])
    parser.add_argument("--run-name", required=True)
    parser.add_argument("--report", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--slow-rank", type=int, default=None, help="this rank also works --slow-ms on the host a step")
    parser.add_argument("--slow-ms", type=float, default=0.0)
    parser.add_argument("--loader-ms", type=float, default=0.0, help="each batch takes this long to load")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--alternate-from", type=int, default=None, help="from this step, faults every other step")
    parser.add_argument("--blocks", action="store_true", help="price each block of the model (blocks=)")
    parser.add_argument("--heavy-block", type=int, default=None, help="this block runs four linear layers")
    parser.add_argument("--declare", type=json.loads, default={}, help="JSON keys for collector.init's config")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    collector.init(run=args.run_name, config=args.declare)
    model = build(args.mode, args.layers, args.blocks, args.heavy_block)
    optimizer = collector.instrument_optimizer(torch.optim.SGD(model.parameters(), lr=1e-3))
    alternate_from = args.steps if args.alternate_from is None else args.alternate_from

    def faulty(index: int) -> bool:
        return index < alternate_from or (index - alternate_from) % 2 == 1

    batches = DataLoader(
        SlowBatches(args.steps, args.batch, args.loader_ms, faulty), batch_size=None, num_workers=args.workers
    )
    own: list[dict[str, float]] = []
    cycle_start = time.perf_counter()
    for index, (inputs, targets) in enumerate(collector.timed_batches(batches)):
        slow_ms = args.slow_ms if faulty(index) else 0.0
        with collector.step():
            step_start = time.perf_counter()
            optimizer.zero_grad()
            forward_start = time.perf_counter()
            outputs = model(inputs)
            forward_end = time.perf_counter()
            if dist.get_rank() == args.slow_rank:  # host work outside the model: its peers wait in the all-reduce
                time.sleep(slow_ms / 1e3)
            loss = nn.functional.mse_loss(outputs, targets)
            backward_start = time.perf_counter()
            loss.backward()
            backward_end = time.perf_counter()
            if args.mode in ("hand", "bare"):
                all_reduce_gradients(model)
            optimizer.step()
            own.append(
                {
                    "forward_s": forward_end - forward_start,
                    "backward_s": backward_end - backward_start,
                    "step_s": time.perf_counter() - step_start,
                    "cycle_s": time.perf_counter() - cycle_start,
                }
            )
            cycle_start = time.perf_counter()
    collector.shutdown()
    rank = dist.get_rank()
    Path(f"{args.report}.{rank}.json").write_text(json.dumps(own))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
