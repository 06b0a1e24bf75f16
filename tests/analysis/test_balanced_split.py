"""``balanced_split`` finds the same split as the plain O(stages x layers^2) programme it replaced (ties
included: equal and zero-cost layers), with or without each stage's own work (what it computes outside its
layers), in O(stages x layers x log layers)."""

from __future__ import annotations

import random

import pytest

from bubblescope.analysis.simulator import StageCost
from bubblescope.analysis.whatif import balanced_split


def reference_split(weights: list[float], stages: int, own: list[float] | None = None) -> tuple[int, ...]:
    """The scan: best[k][i] = min over j of max(best[k-1][j], own[k-1] + cost of layers j..i), first j on ties."""
    extra = own or [0.0] * stages
    n = len(weights)
    prefix = [0.0]
    for weight in weights:
        prefix.append(prefix[-1] + weight)
    best = [[float("inf")] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for i in range(k, n - (stages - k) + 1):
            for j in range(k - 1, i):
                worst = max(best[k - 1][j], extra[k - 1] + prefix[i] - prefix[j])
                if worst < best[k][i] - 1e-9:
                    best[k][i], cut[k][i] = worst, j
    counts, i = [], n
    for k in range(stages, 0, -1):
        counts.append(i - cut[k][i])
        i = cut[k][i]
    return tuple(reversed(counts))


def costs(weights: list[float]) -> tuple[StageCost, ...]:
    return tuple(StageCost(forward_ns=w / 3, backward_ns=2 * w / 3) for w in weights)


@pytest.mark.parametrize("seed", range(4))
def test_the_bisection_finds_the_scans_split(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(500):
        n = rng.randint(1, 16)
        stages = rng.randint(1, n)
        shape = rng.random()
        if shape < 0.3:
            weights = [3.0] * n
        elif shape < 0.5:
            weights = [rng.choice([0.0, 1.0, 2.0]) for _ in range(n)]
        else:
            weights = [rng.uniform(0, 10) for _ in range(n)]
        # own work as ``StageLayers.own_work`` gives it: the first's, the last's, the cheapest for the ones between
        first, last = rng.choice([0.0, rng.uniform(0, 20)]), rng.choice([0.0, rng.uniform(0, 20)])
        middle = min(first, last, rng.uniform(0, 5))
        own = [first] + [middle] * (stages - 2) + [last] if stages > 1 and rng.random() < 0.5 else None
        assert balanced_split(costs(weights), stages, own) == reference_split(
            [c.forward_ns + c.backward_ns for c in costs(weights)], stages, own
        ), (weights, stages, own)


def test_a_last_stage_with_a_loss_of_two_layers_gets_two_layers_fewer() -> None:
    """Six equal layers over two stages: 3,3 by layers; with the last stage's own work (a loss, a head) worth
    two layers, 4,2 balances the time (4 against 2 + 2)."""
    assert balanced_split(costs([3.0] * 6), 2) == (3, 3)
    assert balanced_split(costs([3.0] * 6), 2, [0.0, 6.0]) == (4, 2)


def test_a_thousand_layers_split_without_a_cubic_programme() -> None:
    """1,024 layers over 512 stages: about 0.6 s here; the scan it replaced took minutes."""
    rng = random.Random(7)
    split = balanced_split(costs([rng.uniform(1, 2) for _ in range(1024)]), 512)
    assert len(split) == 512 and sum(split) == 1024 and min(split) >= 1
