"""A gloo job whose rank 1 leaves the last all-reduce out, written from torch's Flight Recorder notes: the
recorder is on with ``TORCH_FR_BUFFER_SIZE``, and each rank dumps it (the pickle, and its JSON) while rank 0 is
blocked in the all-reduce that rank 1 has not joined; then rank 1 joins it, so that the job ends.

    TORCH_FR_BUFFER_SIZE=100 torchrun --nproc-per-node 2 tests/traces/fr_job.py --out DIR
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tensor = torch.ones(1024)
    for _ in range(3):
        dist.all_reduce(tensor)
    dist.broadcast(tensor, src=0)
    dump = args.out / f"nccl_trace_rank_{rank}"
    if rank == 0:
        hanging = dist.all_reduce(tensor, async_op=True)  # rank 1 has not joined it
        wait_for(args.out / "nccl_trace_rank_1")
        (args.out / "trace_rank_0.json").write_bytes(_dump_fr_trace_json())
        dump.write_bytes(_dump_fr_trace())
        hanging.wait()
    else:
        (args.out / "trace_rank_1.json").write_bytes(_dump_fr_trace_json())
        dump.write_bytes(_dump_fr_trace())
        wait_for(args.out / "nccl_trace_rank_0")
        dist.all_reduce(tensor)
    dist.barrier()  # both past the last collective before either tears down
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
