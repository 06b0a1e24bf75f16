"""A two-stage CPU pipeline (gloo, torch.distributed.pipelining's 1F1B) written from the README's snippet, both
collected by bubblescope and profiled by torch.profiler, each step inside both: the round trip's job.

    torchrun --nproc-per-node 2 tests/traces/profiled_pipeline_job.py --trace-dir DIR [--steps 8] [--record-shapes]
        [--schedule 1f1b|gpipe|interleaved]

``--schedule gpipe`` runs GPipe (torch annotates ``Forward i``/``Backward i``); ``interleaved``, interleaved 1F1B
with two stages a rank, one layer each (torch annotates each action ``PP:{stage}{F|B}{micro-batch}``).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from torch.profiler import ProfilerActivity, profile, schedule

from bubblescope import collector


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trace-dir", required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--record-shapes", action="store_true", help="as the profiler's record_shapes: P2P peers")
    parser.add_argument("--schedule", choices=["1f1b", "gpipe", "interleaved"], default="1f1b")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(512, 512), nn.GELU()) for _ in range(2)])
    loss = lambda y, t: ((y - t) ** 2).mean()
    if args.schedule == "interleaved":  # stage s on rank s % world: layer 0 of the model on rank 0, then rank 1, ...
        stages = [PipelineStage(model[v], rank + v * world, 2 * world, torch.device("cpu")) for v in range(2)]
        pipeline = ScheduleInterleaved1F1B(stages, n_microbatches=4, loss_fn=loss)
    else:
        stage = PipelineStage(model, rank, world, torch.device("cpu"))
        pipeline = (ScheduleGPipe if args.schedule == "gpipe" else Schedule1F1B)(stage, n_microbatches=4, loss_fn=loss)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    collector.init(run="profiled-pipeline")
    collector.instrument(pipeline)
    collector.instrument_optimizer(optimizer)
    every = schedule(wait=1, warmup=1, active=args.steps - 2)
    written = lambda prof: prof.export_chrome_trace(f"{args.trace_dir}/rank{rank}.json")
    with profile(
        activities=[ProfilerActivity.CPU], schedule=every, on_trace_ready=written, record_shapes=args.record_shapes
    ) as profiler:
        for _ in range(args.steps):
            with collector.step():
                inputs, targets = torch.randn(64, 512), torch.randn(64, 512)
                optimizer.zero_grad()
                if rank == 0:
                    pipeline.step(inputs)
                elif rank == world - 1:
                    pipeline.step(target=targets)
                else:
                    pipeline.step()
                optimizer.step()
            profiler.step()
    collector.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
