"""Timestamps and cross-rank clock alignment.

Spans are timed with ``local_ns`` (``time.perf_counter_ns``: monotonic, and a C builtin, so a
timestamp on the training thread costs no Python call) and shipped as Unix-epoch nanoseconds:
``to_epoch`` adds the anchor (read once per process) on the shipper thread. Ranks on other
hosts disagree on epoch time, so each rank also estimates its offset to rank 0 by timed
ping-pongs over the process group (the NTP estimate from the round trip with the smallest delay,
zero when that round trip cannot tell the clocks apart: ``settled``) and registers it; the service
subtracts it in every cross-rank view. ``clock_sync`` runs the rounds (at start and periodically)
behind a store handshake, so a rank that never calls ``init`` cannot hang the others.

``BUBBLESCOPE_CLOCK_SKEW_NS`` shifts this process's clock by that many nanoseconds (``set_skew``,
called when the collector initialises): a way to check, on one host, that alignment undoes a
skew between hosts.

The GPU path (``gpu_timing``: CUDA events anchored to host time once per step) takes its host
anchor from ``local_ns``; nothing here calls ``torch.cuda.synchronize``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

local_ns = time.perf_counter_ns
"""This process's monotonic clock in nanoseconds: every time the recorder holds is on it."""


def _read_anchor(reads: int = 25) -> int:
    """Epoch minus performance-counter time, from the read pair bracketed most tightly.

    A process descheduled between the two reads would otherwise carry a millisecond error.
    """
    best_gap, best_anchor = None, 0
    for _ in range(reads):
        before = local_ns()
        wall = time.time_ns()
        after = local_ns()
        if best_gap is None or after - before < best_gap:
            best_gap, best_anchor = after - before, wall - (before + after) // 2
    return best_anchor


_MEASURED_ANCHOR_NS = _read_anchor()
_ANCHOR_NS = _MEASURED_ANCHOR_NS  # plus the skew asked for, once the collector initialised


def set_skew(skew_ns: int) -> None:
    """Shift this process's epoch clock by ``skew_ns`` from the measured one (not cumulative)."""
    global _ANCHOR_NS
    _ANCHOR_NS = _MEASURED_ANCHOR_NS + skew_ns


def now_ns() -> int:
    """Current time as epoch nanoseconds, from the monotonic performance counter."""
    return to_epoch(local_ns())


def to_epoch(local: int) -> int:
    """A ``local_ns`` reading as epoch nanoseconds."""
    return local + _ANCHOR_NS


@dataclass(frozen=True)
class ClockOffset:
    """This rank's clock minus rank 0's clock, and half the best round trip as uncertainty."""

    offset_ns: int
    uncertainty_ns: int


def ping_buffer(dist: Any) -> Any:
    """A one-element int64 tensor where the backend can send it (the current GPU on NCCL)."""
    import torch

    device = "cpu"
    if dist.get_backend() == "nccl":
        device = f"cuda:{torch.cuda.current_device()}"
    return torch.zeros(1, dtype=torch.int64, device=device)


def answer_pings(dist: Any, peer: int, rounds: int) -> None:
    """Rank 0's side of ``ping_rank0``: stamp and return each of ``peer``'s pings."""
    buffer = ping_buffer(dist)
    for _ in range(rounds):
        dist.recv(buffer, src=peer)
        buffer.fill_(now_ns())
        dist.send(buffer, dst=peer)


def ping_rank0(dist: Any, rounds: int) -> ClockOffset:
    """Ping-pong with rank 0 (which runs ``answer_pings`` for this rank at the same time).

    This rank sends t1, rank 0 stamps t2 on receipt and replies, this rank stamps t3 on the
    reply. offset = (t1 + t3) / 2 - t2 for the round with the smallest t3 - t1; the
    uncertainty is half that round trip.
    """
    buffer = ping_buffer(dist)
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
    return settled(best)


def settled(estimate: ClockOffset) -> ClockOffset:
    """Zero when the round trip cannot tell the two clocks apart (``|offset| <= uncertainty``), with the error
    that choice can carry (``|offset| + uncertainty``); else the estimate as measured.

    Ranks on one host read one system clock: their true offset is zero, and a round trip delayed on one side
    (a loaded host schedules one of the two late) moves the midpoint by up to half its length (0.5-1.4 ms between
    two ranks of one host beside busy loops on the 2-core test machine). Ranks on hosts whose clocks NTP or PTP keep
    together are near zero too; a real skew larger than the round trip is still measured."""
    if abs(estimate.offset_ns) <= estimate.uncertainty_ns:
        return ClockOffset(0, abs(estimate.offset_ns) + estimate.uncertainty_ns)
    return estimate
