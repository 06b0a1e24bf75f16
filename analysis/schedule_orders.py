"""Per-rank action orders of every pipeline schedule, as plain data (the registry in
``schedules.py`` names them).

The orders follow the ones ``torch.distributed.pipelining`` (torch 2.13) executes — ported, not
imported, so the analysis layer stays free of torch — and the naive layer-wise split. A test
compares them action for action with torch's own ``pipeline_order`` where torch has one.

Action kinds: ``F`` forward, ``B`` full backward, ``I`` backward for inputs, ``W`` backward for
weights (zero-bubble schedules split B into I then W). DualPipeV's overlapped forward+backward
pairs run here as the forward then the backward: on one compute stream that is what they cost.
"""

from __future__ import annotations

from dataclasses import dataclass

FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT = "F", "B", "I", "W"


@dataclass(frozen=True)
class Action:
    kind: str
    stage: int
    microbatch: int


def gpipe(rank: int, p: int, m: int, v: int) -> list[Action]:
    return [Action(FORWARD, rank, j) for j in range(m)] + [Action(BACKWARD, rank, j) for j in range(m)]


def one_f_one_b(rank: int, p: int, m: int, v: int) -> list[Action]:
    """torch's Schedule1F1B: p - rank warm-up forwards, then backward/forward pairs, then backwards."""
    warmup = min(m, p - rank)
    actions = [Action(FORWARD, rank, j) for j in range(warmup)]
    for j in range(m):
        actions.append(Action(BACKWARD, rank, j))
        if warmup + j < m:
            actions.append(Action(FORWARD, rank, warmup + j))
    return actions


def looped_bfs(rank: int, p: int, m: int, v: int) -> list[Action]:
    stages = range(rank, p * v, p)
    forwards = [Action(FORWARD, s, j) for s in stages for j in range(m)]
    return forwards + [Action(BACKWARD, s, j) for s in reversed(stages) for j in reversed(range(m))]


def interleaved(rank: int, p: int, m: int, v: int, zero_bubble: bool) -> list[Action]:
    """torch's ScheduleInterleaved1F1B / ScheduleInterleavedZeroBubble (``_get_1f1b_rank_ops``)."""
    per_round = m // max(1, m // p)
    factor = 1 if zero_bubble else 2
    warmup = min((v - 1) * per_round + factor * (p - 1 - rank), m * v)
    steady = m * v - warmup

    def forward_stage(op: int) -> int:
        return ((op // per_round) % v) * p + rank

    def backward_stage(op: int) -> int:
        return (v - 1 - ((op - warmup) // per_round) % v) * p + rank

    count: dict[tuple[str, int], int] = {}

    def take(kind: str, stage: int) -> Action:
        index = count.get((kind, stage), 0)
        count[(kind, stage)] = index + 1
        return Action(kind, stage, index)

    backward_kind = BACKWARD_INPUT if zero_bubble else BACKWARD
    backward_ops: list[int] = []
    weights_done = 0
    actions: list[Action] = []
    for op in range(m * v + warmup):
        if op < warmup:
            actions.append(take(FORWARD, forward_stage(op)))
            continue
        if op < warmup + steady:
            actions.append(take(FORWARD, forward_stage(op)))
        actions.append(take(backward_kind, backward_stage(op)))
        backward_ops.append(op)
        if zero_bubble and op - warmup >= rank:
            actions.append(take(BACKWARD_WEIGHT, backward_stage(backward_ops[weights_done])))
            weights_done += 1
    while zero_bubble and weights_done < len(backward_ops):
        actions.append(take(BACKWARD_WEIGHT, backward_stage(backward_ops[weights_done])))
        weights_done += 1
    return actions


def zbv(rank: int, p: int, m: int, v: int) -> list[Action]:
    """torch's ScheduleZBVZeroBubble; micro-batches past ``m`` (its padding) are dropped."""
    n = max(2 * p - 1, m)
    chunk0, chunk1 = rank, 2 * p - 1 - rank
    f0 = f1 = b0 = b1 = 0
    out: list[Action] = []
    for _ in range(2 * (p - rank) - 1):
        out.append(Action(FORWARD, chunk0, f0))
        f0 += 1
    for _ in range(rank):
        out += [Action(FORWARD, chunk1, f1), Action(FORWARD, chunk0, f0)]
        f1 += 1
        f0 += 1
    for _ in range(p - rank):
        out += [Action(FORWARD, chunk1, f1), Action(BACKWARD_INPUT, chunk1, b1), Action(BACKWARD_WEIGHT, chunk1, b1)]
        f1 += 1
        b1 += 1
    while f1 < f0 or f0 < n:
        if f0 < n:
            out.append(Action(FORWARD, chunk0, f0))
            f0 += 1
        out += [Action(BACKWARD_INPUT, chunk0, b0), Action(BACKWARD_WEIGHT, chunk0, b0)]
        b0 += 1
        out += [Action(FORWARD, chunk1, f1), Action(BACKWARD_INPUT, chunk1, b1), Action(BACKWARD_WEIGHT, chunk1, b1)]
        f1 += 1
        b1 += 1
    w0, w1 = b0, b1
    for _ in range(rank):
        out += [Action(BACKWARD_INPUT, chunk0, b0), Action(BACKWARD_INPUT, chunk1, b1)]
        b0 += 1
        b1 += 1
    for _ in range(p - rank):
        out += [Action(BACKWARD_INPUT, chunk0, b0), Action(BACKWARD_WEIGHT, chunk0, w0)]
        b0 += 1
        w0 += 1
    out += [Action(BACKWARD_WEIGHT, chunk1, j) for j in range(w1, b1)]
    out += [Action(BACKWARD_WEIGHT, chunk0, j) for j in range(w0, b0)]
    return [a for a in out if a.microbatch < m]


def dualpipev(rank: int, p: int, m: int, v: int) -> list[Action]:
    """torch's ScheduleDualPipeV (after deepseek-ai/DualPipe), overlapped pairs run back to back."""
    stage0, stage1 = rank, 2 * p - 1 - rank
    counters: dict[tuple[int, str], int] = {}
    weight_queue: list[tuple[int, int]] = []
    out: list[Action] = []

    def add(stage: int, kind: str) -> None:
        key = (stage, BACKWARD_INPUT if kind == BACKWARD else kind)
        index = counters.get(key, 0)
        counters[key] = index + 1
        out.append(Action(kind, stage, index))
        if kind == BACKWARD_INPUT:
            weight_queue.append((stage, index))

    def add_weight() -> None:
        if weight_queue:
            stage, index = weight_queue.pop(0)
            out.append(Action(BACKWARD_WEIGHT, stage, index))

    def add_pair(forward_stage: int, backward_stage: int) -> None:
        add(forward_stage, FORWARD)
        add(backward_stage, BACKWARD)

    for _ in range((p - rank - 1) * 2):
        add(stage0, FORWARD)
    for _ in range(rank + 1):
        add(stage0, FORWARD)
        add(stage1, FORWARD)
    for _ in range(p - rank - 1):
        add(stage1, BACKWARD_INPUT)
        add_weight()
        add(stage1, FORWARD)
    for i in range(m - 2 * p + rank + 1):
        if i == 0 and rank == p - 1:
            add(stage0, FORWARD)
            add(stage1, BACKWARD)
        else:
            add_pair(stage0, stage1)
        add_pair(stage1, stage0)
    for _ in range(p - rank - 1):
        add(stage1, BACKWARD)
        add_pair(stage1, stage0)
    zero_bubble = False
    half = (rank + 1) // 2
    for i in range(rank + 1):
        if i == half and rank % 2 == 1:
            zero_bubble = True
        add(stage1, BACKWARD_INPUT if zero_bubble else BACKWARD)
        if i == half and rank % 2 == 0:
            zero_bubble = True
        add(stage0, BACKWARD_INPUT if zero_bubble else BACKWARD)
    for _ in range(p - rank - 1):
        add_weight()
        add(stage0, BACKWARD_INPUT if zero_bubble else BACKWARD)
    for _ in range(rank + 1):
        add_weight()
    return out


def interleaved_1f1b(rank: int, p: int, m: int, v: int) -> list[Action]:
    return interleaved(rank, p, m, v, zero_bubble=False)


def interleaved_zero_bubble(rank: int, p: int, m: int, v: int) -> list[Action]:
    return interleaved(rank, p, m, v, zero_bubble=True)
