"""Timestamps and cross-rank clock alignment.

Spans are timed with ``time.perf_counter_ns`` (monotonic, cheap) and shipped as Unix-epoch
nanoseconds: ``perf_counter_ns() + anchor``, the anchor read once per process. Ranks on other
hosts disagree on epoch time, so each rank also estimates its offset to rank 0 by timed
ping-pongs over the process group (the NTP estimate from the round trip with the smallest delay)
and registers it; the service subtracts it in every cross-rank view.

The GPU path (CUDA events anchored to host time once per step) plugs in at ``now_ns``'s callers
in a later issue; nothing here calls ``torch.cuda.synchronize``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

_perf_counter_ns = time.perf_counter_ns


def _read_anchor(reads: int = 25) -> int:
    """Epoch minus performance-counter time, from the read pair bracketed most tightly.

    A process descheduled between the two reads would otherwise carry a millisecond error.
    """
    best_gap, best_anchor = None, 0
    for _ in range(reads):
        before = _perf_counter_ns()
        wall = time.time_ns()
        after = _perf_counter_ns()
        if best_gap is None or after - before < best_gap:
            best_gap, best_anchor = after - before, wall - (before + after) // 2
    return best_anchor


_ANCHOR_NS = _read_anchor()


def now_ns() -> int:
    """Current time as epoch nanoseconds, from the monotonic performance counter."""
    return _perf_counter_ns() + _ANCHOR_NS


@dataclass(frozen=True)
class ClockOffset:
    """This rank's clock minus rank 0's clock, and half the best round trip as uncertainty."""

    offset_ns: int
    uncertainty_ns: int


def estimate_offset_to_rank0(dist: Any, rounds: int = 16) -> ClockOffset:
    """Ping-pong with rank 0 over the default process group; every rank must call this.

    Rank 0 answers each rank in turn: the rank sends t1, rank 0 stamps t2 on receipt and
    replies, the rank stamps t3 on the reply. offset = (t1 + t3) / 2 - t2 for the round with the
    smallest t3 - t1. Works on gloo (CPU tensors); on NCCL the tensors live on the current GPU.
    """
    import torch

    rank, world = dist.get_rank(), dist.get_world_size()
    device = "cpu"
    if dist.get_backend() == "nccl":
        device = f"cuda:{torch.cuda.current_device()}"
    if world == 1:
        return ClockOffset(0, 0)
    buffer = torch.zeros(1, dtype=torch.int64, device=device)
    if rank == 0:
        for peer in range(1, world):
            for _ in range(rounds):
                dist.recv(buffer, src=peer)
                buffer.fill_(now_ns())
                dist.send(buffer, dst=peer)
        return ClockOffset(0, 0)
    best: ClockOffset | None = None
    for _ in range(rounds):
        t1 = now_ns()
        buffer.fill_(t1)
        dist.send(buffer, dst=0)
        dist.recv(buffer, src=0)
        t3 = now_ns()
        t2 = int(buffer.item())
        estimate = ClockOffset((t1 + t3) // 2 - t2, (t3 - t1) // 2)
        if best is None or estimate.uncertainty_ns < best.uncertainty_ns:
            best = estimate
    assert best is not None
    return best
