"""Small real training jobs, one per way of splitting a model, for the collector tests.

Run under torchrun (gloo, CPU)::

    torchrun --standalone --nproc-per-node 4 tests/collector/parallel_job.py --mode hybrid2d

Modes: naive (layer-wise model parallelism, hand-written send/recv), ddp, fsdp (FSDP2
``fully_shard``), tp (tensor parallelism on a 1-D DeviceMesh), collectives (every
torch.distributed call once), compiled (a torch.compile'd region), hybrid2d (dp x pp), hybrid3d (dp x tp x pp, 8 processes).
``--raise-at=RANK:STEP`` makes a rank of the naive job fail (an uncaught exception).
``--drift=RANK:MS_PER_S`` makes that rank's clock drift: it gains MS_PER_S milliseconds every
second (loses them, negative) against the others from the moment the job starts. Mode async
(2 ranks): async point-to-point ops and an async all-reduce completing long after or before their
wait, and collectives inside communication spans the job wrote itself (see ``async_ops``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

# Before collector.init (which applies it): shift this rank's clock, as another host's clock would be.
for _arg in sys.argv:
    if _arg.startswith("--skew=") and _arg.split("=")[1].split(":")[0] == os.environ.get("RANK"):
        os.environ["BUBBLESCOPE_CLOCK_SKEW_NS"] = str(int(float(_arg.split(":")[1]) * 1e6))


# Before bubblescope is imported, a drifting clock: the collector takes every timestamp from
# ``time.perf_counter_ns`` (bound when it is imported) and turns it into epoch time through one
# anchor read against ``time.time_ns``, so a performance counter that runs fast or slow is what a
# drifting host clock looks like to it. The C pipelining wrappers read the clock themselves, so
# this rank uses the Python ones (their clock check would turn the C ones off anyway).
def _drifting_clock(rate: float, real_ns: object = time.perf_counter_ns) -> object:
    """A performance counter that gains ``rate`` ns per ns (loses, negative) from now on."""
    started = real_ns()  # type: ignore[operator]

    def perf_counter_ns() -> int:
        now = real_ns()  # type: ignore[operator]
        return now + int((now - started) * rate)

    return perf_counter_ns


for _arg in sys.argv:
    if _arg.startswith("--drift=") and _arg.split("=")[1].split(":")[0] == os.environ.get("RANK"):
        time.perf_counter_ns = _drifting_clock(float(_arg.split(":")[1]) / 1e3)  # type: ignore[assignment]
        os.environ["BUBBLESCOPE_PURE_PYTHON"] = "1"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

from bubblescope import collector  # noqa: E402

HIDDEN = 64


def mlp(layers: int, seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.ReLU()) for _ in range(layers)])


def autocast(args: argparse.Namespace) -> contextlib.AbstractContextManager[object]:
    if args.bf16:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def naive(args: argparse.Namespace) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    layers = mlp(args.layers, seed=rank)
    stage = collector.LayerwiseStage(stage=rank, num_stages=world)
    optimizer = collector.instrument_optimizer(torch.optim.SGD(layers.parameters(), lr=1e-3))
    for step in range(args.steps):
        if args.raise_at == (rank, step):
            raise RuntimeError(f"injected failure on rank {rank} at step {step}")
        with collector.step():
            if rank == 0:
                with collector.span("data_loading"):
                    x = torch.randn(args.batch, HIDDEN)
            else:
                x = stage.recv_activation(torch.empty(args.batch, HIDDEN))
            with stage.forward(), autocast(args):
                y = layers(x)
                loss = y.float().pow(2).mean() if rank == world - 1 else None
            if rank < world - 1:  # activations travel as float32, whatever autocast computed in
                stage.send_activation(y.float())
                grad = stage.recv_gradient(torch.empty(args.batch, HIDDEN))
                with stage.backward():
                    y.backward(grad.to(y.dtype))
            else:
                with stage.backward():
                    loss.backward()
            if rank > 0:
                stage.send_gradient(x.grad)
            optimizer.step()
            optimizer.zero_grad()
            if args.sleep_ms:
                time.sleep(args.sleep_ms / 1e3)  # idle at the step's end, just before the next clock round


def data_parallel(args: argparse.Namespace) -> None:
    model = mlp(args.layers, seed=0)
    if args.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        model = collector.instrument_ddp(DistributedDataParallel(model, bucket_cap_mb=0.01))
    else:
        from torch.distributed.fsdp import fully_shard

        for block in model:
            fully_shard(block)
        fully_shard(model)
    optimizer = collector.instrument_optimizer(torch.optim.SGD(model.parameters(), lr=1e-3))
    batches = (torch.randn(args.batch, HIDDEN) for _ in range(args.steps))
    for x in collector.timed_batches(batches):
        with collector.step():
            with autocast(args):
                loss = model(x).float().pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()


def tensor_parallel(mesh: object, args: argparse.Namespace) -> nn.Module:
    """A two-layer MLP per block, column- then row-wise split over ``mesh``."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(HIDDEN, 4 * HIDDEN), nn.ReLU(), nn.Linear(4 * HIDDEN, HIDDEN))
    return parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})


def tp(args: argparse.Namespace) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = collector.register_mesh(init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",)))
    model = tensor_parallel(mesh, args)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(args.steps):
        with collector.step():
            x = torch.randn(args.batch, HIDDEN)
            with collector.span("forward"), autocast(args):
                loss = model(x).float().pow(2).mean()
            with collector.span("backward"):
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()


def every_collective(args: argparse.Namespace) -> None:
    """Each torch.distributed call once per step, with known sizes (float32, 1024 elements)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    n = 1024
    for _ in range(args.steps):
        with collector.step():
            t = torch.ones(n)
            dist.all_reduce(t)
            dist.all_gather([torch.empty(n) for _ in range(world)], t)
            dist.all_gather_into_tensor(torch.empty(n * world), t)
            dist.reduce_scatter(torch.empty(n), [torch.ones(n) for _ in range(world)])
            dist.reduce_scatter_tensor(torch.empty(n), torch.ones(n * world))
            dist.all_to_all([torch.empty(n) for _ in range(world)], [torch.ones(n) for _ in range(world)])
            dist.all_to_all_single(torch.empty(n * world), torch.ones(n * world))
            dist.broadcast(t, src=0)
            peer = (rank + 1) % world if rank % 2 == 0 else (rank - 1) % world
            if rank % 2 == 0:
                dist.send(t, dst=peer)
                dist.recv(t, src=peer)
            else:
                dist.recv(t, src=peer)
                dist.send(t, dst=peer)
            work = dist.isend(t, dst=peer) if rank % 2 == 0 else dist.irecv(t, src=peer)
            work.wait()
            ops = [dist.P2POp(dist.isend, t, peer), dist.P2POp(dist.irecv, torch.empty(n), peer)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
            work = dist.all_reduce(t, async_op=True)
            work.wait()


ASYNC_DELAY_S = 0.1


def async_ops(args: argparse.Namespace) -> None:
    """Per step, on 2 ranks (``ASYNC_DELAY_S`` = D):

    1. rank 1 posts an ``irecv`` and waits on it at once; rank 0 sleeps D (no span), posts the
       matching ``isend``, computes D (a forward span named "busy-send") and only then waits;
    2. after a barrier, rank 0 posts ``all_reduce(async_op=True)`` and computes 3D ("busy-async")
       before waiting; rank 1 sleeps D before its (blocking) part: the op completes about D after
       posting, 2D before the wait;
    3. both: an all-reduce and a broadcast inside communication spans of their own ("own-all-reduce",
       "own-broadcast"), and an all-reduce inside a compute span ("compute-around-comm").
    """
    rank = dist.get_rank()
    for _ in range(args.steps):
        with collector.step():
            t = torch.ones(1024)
            if rank == 0:
                time.sleep(ASYNC_DELAY_S)
                work = dist.isend(t, dst=1)
                with collector.span("forward", name="busy-send"):
                    time.sleep(ASYNC_DELAY_S)
                work.wait()
            else:
                dist.irecv(t, src=0).wait()
            x = torch.ones(256)
            dist.barrier()  # phase 2 starts together on both ranks (barrier is not traced)
            if rank == 0:
                work = dist.all_reduce(x, async_op=True)
                with collector.span("backward", name="busy-async"):
                    time.sleep(3 * ASYNC_DELAY_S)
                work.wait()
            else:
                time.sleep(ASYNC_DELAY_S)
                dist.all_reduce(x)
            y = torch.ones(64)
            with collector.span("all_reduce", group="mine", name="own-all-reduce", bytes=y.numel() * y.element_size()):
                dist.all_reduce(y)
            with collector.span("broadcast", name="own-broadcast"):
                dist.broadcast(y, src=0)
            with collector.span("forward", name="compute-around-comm"):
                dist.all_reduce(torch.ones(8))


def compiled(args: argparse.Namespace) -> None:
    """A torch.compile'd region with a collective inside, between hand-written spans."""
    model = mlp(args.layers, seed=0)

    def forward(x: torch.Tensor) -> torch.Tensor:
        y = model(x).clone()  # the ReLU output itself is saved for backward
        dist.all_reduce(y)  # traced into the graph: the collector must stay out of the trace
        return y

    compiled_forward = torch.compile(forward, backend="aot_eager")
    for _ in range(args.steps):
        with collector.step():
            with collector.span("forward"):
                loss = compiled_forward(torch.randn(args.batch, HIDDEN)).pow(2).mean()
            with collector.span("backward"):
                loss.backward()
            dist.all_reduce(torch.ones(8))  # eager, outside: recorded as usual


def hybrid(args: argparse.Namespace) -> None:
    """DP x PP (2-D) or DP x TP x PP (3-D): a 1F1B pipeline over "pp", TP inside each stage,
    data parallelism across replicas with a gradient all-reduce over "dp"."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    world = dist.get_world_size()
    if args.mode == "hybrid3d":
        shape, names = (2, 2, world // 4), ("dp", "tp", "pp")
    else:
        shape, names = (2, world // 2), ("dp", "pp")
    mesh = collector.register_mesh(init_device_mesh("cpu", shape, mesh_dim_names=names))
    pp_rank, pp_size = mesh["pp"].get_local_rank(), mesh["pp"].size()
    module = tensor_parallel(mesh["tp"], args) if "tp" in names else mlp(args.layers, seed=pp_rank)
    stage = PipelineStage(module, pp_rank, pp_size, torch.device("cpu"), group=mesh.get_group("pp"))
    schedule = collector.instrument(Schedule1F1B(stage, n_microbatches=pp_size, loss_fn=nn.functional.mse_loss))
    optimizer = torch.optim.SGD(module.parameters(), lr=1e-3)
    dp_group = mesh.get_group("dp")
    for _ in range(args.steps):
        with collector.step():
            x, target = torch.randn(args.batch, HIDDEN), torch.randn(args.batch, HIDDEN)
            if stage.is_first:
                schedule.step(x)
            elif stage.is_last:
                schedule.step(target=target)
            else:
                schedule.step()
            for parameter in module.parameters():
                grad = parameter.grad
                local = grad.to_local() if hasattr(grad, "to_local") else grad
                dist.all_reduce(local, group=dp_group)
            optimizer.step()
            optimizer.zero_grad()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--mode",
        required=True,
        choices=["naive", "ddp", "fsdp", "tp", "collectives", "async", "compiled", "hybrid2d", "hybrid3d"],
    )
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--no-collector", action="store_true")
    parser.add_argument("--skew", default=None, help="RANK:MS shifts that rank's clock by MS milliseconds")
    parser.add_argument("--drift", default=None, help="RANK:MS_PER_S: that rank's clock gains MS_PER_S ms a second")
    parser.add_argument(
        "--sleep-ms", type=float, default=0.0, help="naive mode: every rank sleeps this at each step's end"
    )
    parser.add_argument("--disable-rank", type=int, default=None, help="this rank never initialises the collector")
    parser.add_argument(
        "--raise-at",
        type=lambda text: tuple(map(int, text.split(":"))),
        default=None,
        help="RANK:STEP (naive mode): that rank raises before that step",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    if args.disable_rank == dist.get_rank():
        os.environ["BUBBLESCOPE_DISABLED"] = "1"
    if not args.no_collector:
        collector.init(run=f"parallel-{args.mode}", full_spans_every=1)
    runner = {
        "naive": naive,
        "ddp": data_parallel,
        "fsdp": data_parallel,
        "tp": tp,
        "collectives": every_collective,
        "async": async_ops,
        "compiled": compiled,
        "hybrid2d": hybrid,
        "hybrid3d": hybrid,
    }[args.mode]
    runner(args)
    collector.shutdown()
    dist.barrier()
    dist.destroy_process_group()
    if os.environ.get("PARALLEL_JOB_DONE"):
        print("done", flush=True)


if __name__ == "__main__":
    main()
