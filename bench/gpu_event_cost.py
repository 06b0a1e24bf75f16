"""What the collector's CUDA path costs the training thread, call by call, on this GPU: a kernel launch, a
timing event created and recorded (as ``gpu_timing.CudaStepClock.mark``), one recorded from a pool, one read
(``elapsed_time``), and a ``then`` callback on an NCCL all-reduce's future (as the DDP bucket hook). One line each,
in µs per call (median of 5 rounds of 1,000 calls).

    python bench/gpu_event_cost.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

CALLS = 1000


def per_call_us(call: Callable[[], object]) -> float:
    rounds = []
    for _ in range(5):
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(CALLS):
            call()
        rounds.append((time.perf_counter() - started) / CALLS * 1e6)
    torch.cuda.synchronize()
    return statistics.median(rounds)


def main() -> None:
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=0, world_size=1, store=dist.HashStore(), device_id=device)
    tensor = torch.ones(1024, device=device)
    pool = [torch.cuda.Event(enable_timing=True) for _ in range(CALLS)]
    for event in pool:
        event.record()
    index = iter(range(10**9))
    anchor = pool[0]
    torch.cuda.synchronize()
    rows = {
        "kernel launch (tensor.add_)": lambda: tensor.add_(1),
        "Event(enable_timing=True) + record": lambda: torch.cuda.Event(enable_timing=True).record(),
        "record of a pooled event": lambda: pool[next(index) % CALLS].record(),
        "elapsed_time of two done events": lambda: anchor.elapsed_time(pool[1]),
        "NCCL all_reduce (async) + get_future": lambda: dist.all_reduce(tensor, async_op=True).get_future(),
        "NCCL all_reduce + future.then(noop)": lambda: (
            dist.all_reduce(tensor, async_op=True).get_future().then(lambda f: f.value())
        ),
    }
    print(f"device: {torch.cuda.get_device_name(device)}; torch {torch.__version__}")
    for name, call in rows.items():
        print(f"{name:<40} {per_call_us(call):8.2f} µs")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
