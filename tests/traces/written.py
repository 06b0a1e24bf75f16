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


def p2p_kernel(ts: float, dur: float, collective: str, peer: int, correlation: int) -> list[dict[str, Any]]:
    """An NCCL P2P kernel as torch records it: ``Collective name`` send or recv, and the peer's global rank
    (``Dst Rank`` for a send, ``Src Rank`` for a recv; torch/csrc/profiler/util.cpp)."""
    events = kernel(ts, dur, "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", correlation, stream=11)
    events[-1]["args"] |= {"Collective name": collective, "Dst Rank" if collective == "send" else "Src Rank": peer}
    return events


def two_stage_p2p_traces() -> dict[int, list[dict[str, Any]]]:
    """Two pipeline stages, one step: rank 0 computes 110-150 us and 175-185 us, then sends at 150 and 185 us; rank
    1's recvs were launched at 120 and 172 us, so each waits until rank 0's send starts (30 and 13 us: 43 in all)
    and then transfers (20 and 10 us). The nth send from 0 to 1 is the nth recv on 1."""
    step = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 100, "dur": 100}]
    rank0 = step + kernel(110, 40, "sm80_gemm", 1) + p2p_kernel(150, 20, "send", 1, 2)
    rank0 += kernel(175, 10, "sm80_gemm", 3) + p2p_kernel(185, 10, "send", 1, 4)
    rank1 = step + p2p_kernel(120, 50, "recv", 0, 1) + p2p_kernel(172, 23, "recv", 0, 2)
    return {0: rank0, 1: rank1}
