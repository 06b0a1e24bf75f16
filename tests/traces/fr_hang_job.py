"""A collected gloo job that hangs the way a real one does, with Flight Recorder on: at step ``--hang-step`` rank 1
stays in its own code (dumping its recorder first) while rank 0 blocks in the step's all-reduce, and a thread of
rank 0 dumps rank 0's recorder once rank 1's dump is there. Rank 1 goes on when the file ``release`` appears in
``--out``, so that the job ends. Instrumented as docs/collector.md shows (``collector.init``, ``collector.step``).

    TORCH_FR_BUFFER_SIZE=100 BUBBLESCOPE_URL=... torchrun --nproc-per-node 2 tests/traces/fr_hang_job.py --out DIR
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace

from bubblescope import collector


def wait_for(path: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def dump_when_blocked(out: Path, dump: Path) -> None:
    """Rank 0's recorder, once rank 1 has dumped its own and rank 0 has been in the all-reduce for a while."""
    wait_for(out / "nccl_trace_rank_1")
    time.sleep(0.5)
    dump.write_bytes(_dump_fr_trace())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--hang-step", type=int, default=6)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    collector.init(run="fr-hang")
    rank = dist.get_rank()
    tensor = torch.ones(1024)
    dump = args.out / f"nccl_trace_rank_{rank}"
    for step in range(args.steps):
        with collector.step():
            time.sleep(0.05)  # the step's compute
            if step == args.hang_step and rank == 1:
                dump.write_bytes(_dump_fr_trace())
                wait_for(args.out / "release")  # stuck in its own code: the others wait for it
            if step == args.hang_step and rank == 0:
                threading.Thread(target=dump_when_blocked, args=(args.out, dump)).start()
            dist.all_reduce(tensor)
    collector.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
