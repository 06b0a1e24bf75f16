"""Which replicas stand for a big run's step (analysis/sampling.py)."""

from __future__ import annotations

from bubblescope.analysis.sampling import median_and_slowest, sampled_ranks

STAGES, REPLICAS = 4, 100


def _run(slow: dict[int, int]) -> tuple[dict[int, int], dict[int, int | None], dict[int, int | None]]:
    """rank = replica * STAGES + stage; compute 100 (+ the rank's extra), a little spread by replica."""
    ranks = range(STAGES * REPLICAS)
    compute = {r: 100 + (r // STAGES) % 7 + slow.get(r, 0) for r in ranks}
    return compute, {r: r % STAGES for r in ranks}, {r: r // STAGES for r in ranks}


def test_the_sample_is_whole_replicas_holding_each_stages_median_and_slowest_rank() -> None:
    compute, stages, replicas = _run({4 * 57 + 2: 50, 4 * 91 + 0: 30})
    sample = sampled_ranks(compute, stages, replicas, replicas=8)
    picked = {r // STAGES for r in sample}
    assert {57, 91} <= picked  # the slowest of stages 2 and 0
    assert all(all(q * STAGES + s in sample for s in range(STAGES)) for q in picked)  # whole replicas
    assert len(picked) == 8
    chosen = median_and_slowest((r, stages[r], ns) for r, ns in compute.items())
    assert {rank for rank, _, _ in chosen} <= sample
    assert (4 * 57 + 2, 2, f"slowest of {REPLICAS}") in chosen and (4 * 91, 0, f"slowest of {REPLICAS}") in chosen


def test_the_sample_spreads_over_the_replicas_and_keeps_ranks_without_one_alone() -> None:
    compute, stages, replicas = _run({})
    picked = sorted({r // STAGES for r in sampled_ranks(compute, stages, replicas, replicas=10)})
    assert len(picked) == 10 and picked[-1] - picked[0] >= REPLICAS // 2
    alone = sampled_ranks({0: 5, 1: 9, 2: 7}, {0: None, 1: None, 2: None}, {}, replicas=2)
    assert alone == {2, 1}  # the median (7) and the slowest (9), each a replica of its own
