"""A Flight Recorder dump from NCCL, for the README's GPU checks: a world of one on the GPU runs a few
collectives with the recorder on, then dumps it as the pickle and the JSON torch writes, into DIR.

    TORCH_FR_BUFFER_SIZE=100 python bench/gpu_fr_dump.py DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda", 0)
    dist.init_process_group("nccl", rank=0, world_size=1, store=dist.HashStore(), device_id=device)
    tensor = torch.ones(1 << 20, device=device)
    for _ in range(3):
        dist.all_reduce(tensor)
    dist.broadcast(tensor, src=0)
    torch.cuda.synchronize()
    for name, suffix in (("_dump_nccl_trace", "pkl"), ("_dump_nccl_trace_json", "json")):
        dump = getattr(c10d, name, None)
        if dump is None:
            print(f"torch {torch.__version__} has no {name}")
            continue
        (out / f"nccl_trace_rank_0.{suffix}").write_bytes(dump())
        print(f"wrote {name} -> nccl_trace_rank_0.{suffix}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
