"""What each block of a model costs a step: the per-block spans of ``instrument_model(model, blocks=...)``, and
of each pipeline stage's layers (the pipelining integration's, ``wire.stage_layer_span_name``: ``stage`` set).

A block's spans carry ``model/block`` as their name (``wire.block_of``). Per rank and step, a block's forward and
backward are the sums of its spans (several calls a step: micro-batches, gradient accumulation); per rank, the
median over the steps; per block, the median over the ranks, with the slowest rank beside it. A block's share is
of the model's own compute on the median rank (the spans named by the model alone), so the shares of blocks
that cover the model add up to about 1: less what runs between blocks (the head, the loss), give or take
what medians over steps and ranks do not add exactly.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from bubblescope import wire
from bubblescope.analysis.model import TimedSpan

MODEL_PASSES: Final = {"forward": 0, "backward": 1}


@dataclass(frozen=True)
class BlockCost:
    """One block, per step (ns): the median over ranks of its forward and of its backward, and the slowest rank's
    total."""

    block: str
    forward_ns: float
    backward_ns: float
    share_of_model: float | None  # (forward + backward) / the model's own compute on the median rank
    slowest_rank: int
    slowest_ns: float  # forward + backward on the slowest rank
    stage: int | None = None  # the pipeline stage holding it (a stage's layer, ``wire.stage_layer_of``)

    @property
    def total_ns(self) -> float:
        return self.forward_ns + self.backward_ns


def block_costs(steps: Sequence[Sequence[TimedSpan]]) -> list[BlockCost]:
    """Each block's cost over ``steps`` (each step's spans), in the order the blocks first ran forward; empty
    when no block was instrumented."""
    # (block, rank) -> [per step: [forward, backward]]; rank -> per step: the model's own compute
    per_step: dict[tuple[str, int], list[list[int]]] = defaultdict(list)
    model_ns: dict[int, list[int]] = defaultdict(list)
    order: dict[str, int] = {}
    stages: dict[str, int] = {}
    for spans in steps:
        sums: dict[tuple[str, int], list[int]] = {}
        own: dict[int, int] = defaultdict(int)
        for span in sorted((s for s in spans if s.kind in MODEL_PASSES), key=lambda s: s.start_ns):
            block = wire.block_of(span.name)
            if block is None:
                own[span.rank] += span.end_ns - span.start_ns
                continue
            if block not in order:
                order[block] = len(order)
                layer = wire.stage_layer_of(span.name)
                if layer is not None:
                    stages[block] = layer[0]
            sums.setdefault((block, span.rank), [0, 0])[MODEL_PASSES[span.kind]] += span.end_ns - span.start_ns
        for key, step_passes in sums.items():
            per_step[key].append(step_passes)
        for rank, ns in own.items():
            model_ns[rank].append(ns)
    if not order:
        return []
    by_block: dict[str, dict[int, tuple[float, float]]] = defaultdict(dict)
    for (block, rank), steps_passes in per_step.items():
        by_block[block][rank] = (
            statistics.median(p[0] for p in steps_passes),
            statistics.median(p[1] for p in steps_passes),
        )
    model_median = statistics.median(statistics.median(v) for v in model_ns.values()) if model_ns else 0.0
    costs = []
    for block in sorted(by_block, key=order.__getitem__):
        ranks = by_block[block]
        slowest_rank = max(ranks, key=lambda rank: (sum(ranks[rank]), -rank))
        forward = statistics.median(f for f, _ in ranks.values())
        backward = statistics.median(b for _, b in ranks.values())
        costs.append(
            BlockCost(
                block=block,
                forward_ns=forward,
                backward_ns=backward,
                share_of_model=(forward + backward) / model_median if model_median else None,
                slowest_rank=slowest_rank,
                slowest_ns=sum(ranks[slowest_rank]),
                stage=stages.get(block),
            )
        )
    return costs
