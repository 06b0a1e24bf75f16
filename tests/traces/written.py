"""Kineto traces written by the tests: a runtime launch and its kernel, two profiler steps, gzip or plain."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any


def kernel(ts: float, dur: float, name: str, correlation: int, stream: int = 7) -> list[dict[str, Any]]:
    """A runtime launch 5 us before the kernel, and the kernel."""
    launch = {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": "cudaLaunchKernel",
        "ts": ts - 5,
        "dur": 3,
        "args": {"correlation": correlation},
    }
    gpu = {
        "ph": "X",
        "cat": "kernel",
        "name": name,
        "ts": ts,
        "dur": dur,
        "args": {"stream": stream, "correlation": correlation},
    }
    return [launch, gpu]


def trace(rank: int | None = 0, events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Two profiler steps of 100 us; step 1 runs a GEMM (10-40 us) and an NCCL all-reduce (30-70 us) beside it;
    step 2 (the last, which HTA leaves out) one more kernel."""
    steps = [
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": 100 * n, "dur": 100} for n in (1, 2)
    ]
    kernels = kernel(110, 30, "sm80_gemm", 1) + kernel(130, 40, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 2, stream=9)
    kernels += kernel(210, 10, "elementwise_kernel", 3)
    document: dict[str, Any] = {"schemaVersion": 1, "traceEvents": steps + kernels if events is None else events}
    if rank is not None:
        document = {"distributedInfo": {"rank": rank, "world_size": 2}, **document}
    return document


def write(path: Path, document: Any, compress: bool = False) -> Path:
    data = (document if isinstance(document, str) else json.dumps(document)).encode()
    path.write_bytes(gzip.compress(data) if compress else data)
    return path
