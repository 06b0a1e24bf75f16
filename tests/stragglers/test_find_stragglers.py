"""Stragglers on synthetic rank × step matrices: persistent, one-off, intermittent, slow host, slow stage, noise."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from bubblescope.analysis.stragglers import (
    RankPlacement,
    RankStepTimes,
    StragglerThresholds,
    find_stragglers,
)

WINDOW_NS = 15_000_000
Slowdown = Callable[[int, int], float]


def synthetic(
    ranks: int,
    steps: int,
    slow: Slowdown = lambda r, s: 1.0,
    work: Callable[[int], float] = lambda r: 1.0,
    jitter: float = 0.02,
    seed: int = 0,
) -> list[RankStepTimes]:
    """10 ms of compute per rank per step (times ``work`` and ``slow``), ±``jitter`` uniform noise; the
    window is the same for every rank (synchronous training), the rest of it is waiting."""
    noise = random.Random(seed)
    rows = []
    for rank in range(ranks):
        for step in range(steps):
            compute = int(10_000_000 * work(rank) * slow(rank, step) * noise.uniform(1 - jitter, 1 + jitter))
            wait = max(WINDOW_NS - compute, 0)
            rows.append(RankStepTimes(rank, step, max(WINDOW_NS, compute), compute, wait, wait // 2, wait // 2))
    return rows


def two_hosts(ranks: int = 4) -> list[RankPlacement]:
    return [RankPlacement(rank, host=f"h{rank * 2 // ranks}") for rank in range(ranks)]


def dp_by_pp(dp: int = 2, pp: int = 2) -> list[RankPlacement]:
    """Rank = replica * pp + stage; each replica on its own host."""
    return [
        RankPlacement(d * pp + s, host=f"h{d}", stage=s, coords={"dp": d, "pp": s})
        for d in range(dp)
        for s in range(pp)
    ]


def test_persistent_rank_and_one_off_rank_read_differently() -> None:
    slow = lambda r, s: 1.42 if r == 3 else (2.0 if r == 1 and s in (5, 6) else 1.0)
    report = find_stragglers(synthetic(8, 20, slow), [RankPlacement(r, host=f"h{r // 4}") for r in range(8)])
    scores = {score.rank: score for score in report.rank_scores}
    assert scores[3].verdict == "persistent" and scores[3].flagged_fraction == 1.0
    assert scores[3].median_ratio == pytest.approx(1.42, abs=0.03) and scores[3].median_z is not None
    assert scores[3].median_z > 10
    assert scores[1].verdict == "one-off" and scores[1].flagged_steps == [5, 6]
    assert {r for r, s in scores.items() if s.verdict == "normal"} == {0, 2, 4, 5, 6, 7}
    assert report.groups == []
    messages = [finding.message for finding in report.findings]
    assert any(
        m.startswith("rank 3 (host h0) computes 1.4") and "20 of 20 steps: a persistent straggler" in m
        for m in messages
    ), messages
    assert any(
        m.startswith("rank 1 (host h0)") and "steps 5, 6 (2 of 20): a one-off slowdown" in m for m in messages
    ), messages
    # the slow rank's peers wait for it: its compute ratio is high, its idle ratio low
    assert scores[3].phase_ratios["compute"] > 1.3 and scores[3].phase_ratios["idle"] < 0.5
    assert report.flagged[3] == [True] * 20 and report.flagged[1][5:7] == [True, True]


def test_whole_host_slow_is_one_host_finding_not_two_rank_findings() -> None:
    report = find_stragglers(synthetic(4, 12, lambda r, s: 1.5 if r >= 2 else 1.0), two_hosts())
    assert [(g.kind, g.group, g.ranks, g.verdict) for g in report.groups] == [("slow host", "h1", [2, 3], "persistent")]
    assert [f.kind for f in report.findings] == ["slow host"]
    assert report.groups[0].median_ratio == pytest.approx(1.5, abs=0.05)
    assert report.findings[0].message.startswith("host h1 (ranks 2, 3): all its ranks compute 1.")
    # a hiccup on one rank of the other host does not hide the slow host on that step
    hiccup = find_stragglers(
        synthetic(4, 12, lambda r, s: 1.5 if r >= 2 else (1.3 if r == 0 and s == 2 else 1.0)), two_hosts()
    )
    assert hiccup.rank_scores[0].flagged_steps == [] and hiccup.groups[0].flagged_steps == list(range(12))


def test_slow_stage_across_replicas_is_a_band_found_by_history() -> None:
    """Stage 1 does 1.3x the work of stage 0 (imbalance, not a straggler); on steps 8-9 both of its
    ranks (one per replica) slow down 1.6x: a slow stage, one-off. Stage peers cannot see it."""
    slow = lambda r, s: 1.6 if r % 2 == 1 and s in (8, 9) else 1.0
    report = find_stragglers(synthetic(4, 16, slow, work=lambda r: 1.3 if r % 2 else 1.0), dp_by_pp())
    assert all(score.basis == "stage peers" for score in report.rank_scores)
    assert {score.rank: score.peers for score in report.rank_scores} == {0: [2], 1: [3], 2: [0], 3: [1]}
    assert all(score.verdict == "normal" for score in report.rank_scores)  # imbalance is no straggler
    (group,) = report.groups
    assert (group.kind, group.group, group.ranks, group.flagged_steps, group.verdict, group.basis) == (
        "slow stage",
        "1",
        [1, 3],
        [8, 9],
        "one-off",
        "own history",
    )
    assert "a slow stage (one-off)" in report.findings[0].message
    # against the step's median over all ranks the heavier stage is a band; the heat map colours each cell
    # against the baseline its flag compares with (stage peers), where imbalance is no straggler: white
    ratios = report.matrices["compute"].ratio_to_step_median
    assert min(ratios[1]) > 1.05 and max(ratios[0]) < 0.95  # type: ignore[type-var]
    assert all(r is not None and abs(r - 1) < 0.06 for row in report.ratio_to_baseline for r in row)


def test_slow_replica_host_is_reported_once_with_its_alias() -> None:
    report = find_stragglers(synthetic(4, 10, lambda r, s: 1.5 if r >= 2 else 1.0), dp_by_pp())
    (group,) = report.groups
    assert (group.dimension, group.group, group.aliases, group.verdict) == ("host", "h1", ["dp 1"], "persistent")
    assert report.findings[0].message.startswith("host h1, dp 1 (ranks 2, 3)")


def test_noise_and_a_whole_slow_step_give_no_finding() -> None:
    jittery = synthetic(8, 30, jitter=0.05, seed=3)
    assert find_stragglers(jittery, two_hosts(8)).findings == []
    everyone_slow_once = synthetic(8, 30, lambda r, s: 2.0 if s == 0 else 1.0)
    report = find_stragglers(everyone_slow_once, two_hosts(8))
    assert report.findings == [] and report.groups == []


def test_scattered_single_step_flags_read_as_noise_not_as_a_straggler() -> None:
    spikes = {3, 11, 19, 27}
    report = find_stragglers(synthetic(4, 40, lambda r, s: 1.5 if r == 0 and s in spikes else 1.0), two_hosts())
    score = report.rank_scores[0]
    assert score.flagged_steps == sorted(spikes) and score.verdict == "noise"
    assert report.findings == []


def test_flags_on_a_quarter_of_the_steps_scattered_read_as_an_intermittent_straggler() -> None:
    """Every 4th step slow (10 of 40, 10 separate episodes): too many episodes for a one-off, too
    few steps for persistent, at least ``intermittent_fraction`` (20%): intermittent, a finding.
    Every 6th step (7 of 40, 17.5%) is the same pattern under the bar: noise, no finding."""
    every_fourth = set(range(0, 40, 4))
    report = find_stragglers(synthetic(4, 40, lambda r, s: 1.5 if r == 0 and s in every_fourth else 1.0), two_hosts())
    score = report.rank_scores[0]
    assert score.flagged_steps == sorted(every_fourth) and score.flagged_fraction == 0.25
    assert score.verdict == "intermittent"
    assert [s.verdict for s in report.rank_scores[1:]] == ["normal"] * 3
    ((kind, verdict, ranks, steps),) = [(f.kind, f.verdict, f.ranks, f.steps) for f in report.findings]
    assert (kind, verdict, ranks, steps) == ("slow rank", "intermittent", [0], sorted(every_fourth))
    assert report.findings[0].message.endswith("on 10 of 40 steps: an intermittent straggler"), report.findings
    every_sixth = set(range(0, 40, 6))
    sparse = find_stragglers(synthetic(4, 40, lambda r, s: 1.5 if r == 0 and s in every_sixth else 1.0), two_hosts())
    assert sparse.rank_scores[0].flagged_steps == sorted(every_sixth)
    assert sparse.rank_scores[0].verdict == "noise" and sparse.findings == []
    # the bar is the threshold's: lowered under 17.5%, the sparse pattern is intermittent too
    lowered = find_stragglers(
        synthetic(4, 40, lambda r, s: 1.5 if r == 0 and s in every_sixth else 1.0),
        two_hosts(),
        StragglerThresholds(intermittent_fraction=0.15),
    )
    assert lowered.rank_scores[0].verdict == "intermittent"


def test_a_whole_host_slow_on_scattered_steps_is_an_intermittent_slow_host() -> None:
    every_fourth = set(range(0, 40, 4))
    report = find_stragglers(synthetic(4, 40, lambda r, s: 1.5 if r >= 2 and s in every_fourth else 1.0), two_hosts())
    assert [(g.kind, g.group, g.ranks, g.verdict, g.flagged_steps) for g in report.groups] == [
        ("slow host", "h1", [2, 3], "intermittent", sorted(every_fourth))
    ]
    assert [(f.kind, f.verdict) for f in report.findings] == [("slow host", "intermittent")]
    assert report.findings[0].message.endswith("a slow host (intermittent)")


def test_thresholds_ratio_excess_and_persistence() -> None:
    slightly = synthetic(4, 10, lambda r, s: 1.06 if r == 2 else 1.0, jitter=0.0)
    assert find_stragglers(slightly).rank_scores[2].verdict == "normal"  # z is huge, ratio under 1.10
    assert (
        find_stragglers(slightly, thresholds=StragglerThresholds(min_ratio=1.05)).rank_scores[2].verdict == "persistent"
    )
    # 1.5x of a tiny phase: under 1% of the window is not worth a finding
    tiny = [
        RankStepTimes(r, s, 100_000_000, 600_000 if r == 1 else 400_000, 0, 0, 0) for r in range(4) for s in range(5)
    ]
    assert find_stragglers(tiny).rank_scores[1].verdict == "normal"
    # flagged on 2 of 5 steps: one-off at the default half, persistent at a lower bar
    twice = synthetic(4, 5, lambda r, s: 1.5 if r == 1 and s in (1, 2) else 1.0)
    assert find_stragglers(twice).rank_scores[1].verdict == "one-off"
    assert (
        find_stragglers(twice, thresholds=StragglerThresholds(persistent_fraction=0.4)).rank_scores[1].verdict
        == "persistent"
    )


def test_pipeline_without_replicas_compares_each_rank_with_its_own_history() -> None:
    stages = [RankPlacement(r, stage=r) for r in range(3)]
    report = find_stragglers(
        synthetic(3, 12, lambda r, s: 1.8 if r == 2 and s == 4 else 1.0, work=lambda r: 1.0 + 0.2 * r), stages
    )
    assert [s.basis for s in report.rank_scores] == ["own history"] * 3
    assert [s.verdict for s in report.rank_scores] == ["normal", "normal", "one-off"]
    assert "its own median step on step 4 (1 of 12)" in report.findings[0].message
    # each cell's colour is its ratio to that baseline: rank 2's 1.4x the work is no band, its step 4 is
    baseline = report.ratio_to_baseline
    assert baseline[2][4] == pytest.approx(1.8, abs=0.1)
    assert all(
        r is not None and abs(r - 1) < 0.06
        for i, row in enumerate(baseline)
        for j, r in enumerate(row)
        if (i, j) != (2, 4)
    )


def test_missing_cells_and_empty_input() -> None:
    rows = [
        row for row in synthetic(4, 6, lambda r, s: 1.5 if r == 0 else 1.0) if not (row.rank == 0 and row.step == 2)
    ]
    report = find_stragglers(rows)
    assert report.matrices["compute"].values_ns[0][2] is None and report.flagged[0][2] is False
    assert report.rank_scores[0].steps_scored == 5 and report.rank_scores[0].verdict == "persistent"
    empty = find_stragglers([])
    assert empty.ranks == [] and empty.steps == [] and empty.findings == []


def test_a_large_group_finds_its_one_straggler_with_the_shared_mad() -> None:
    """Past ``EXACT_MAD_UP_TO`` ranks a step's MAD is shared by the group (the scale path): one
    slow rank among 256 is still found on every step, and no other rank on any. How long it takes
    at scale is ``bench/stragglers_scale.py``'s figure."""
    rows = synthetic(256, 50, lambda r, s: 1.3 if r == 77 else 1.0)
    report = find_stragglers(rows)
    assert [(f.kind, f.ranks, f.verdict) for f in report.findings] == [("slow rank", [77], "persistent")]
    assert report.rank_scores[77].flagged_steps == list(range(50))
    assert report.rank_scores[77].median_ratio == pytest.approx(1.3, abs=0.03)
    assert [r for r, flags in zip(report.ranks, report.flagged) if any(flags)] == [77]


def test_step_range_defaults_and_bounds() -> None:
    from bubblescope.backend.derived.stragglers import DEFAULT_STEPS, MAX_STEPS, step_range
    from bubblescope.backend.errors import Invalid

    assert step_range(None, None, None) is None
    assert step_range(500, None, None) == (500 - DEFAULT_STEPS + 1, 500)
    assert step_range(20, None, None) == (0, 20)
    assert step_range(500, None, 40) == (0, 40)
    assert step_range(5000, 10, None) == (10, 10 + MAX_STEPS - 1)
    assert step_range(None, 7, None) == (7, 7)
    assert step_range(3, 7, None) == (7, 7)
    # a default range starts past the warm-up (the first 5 steps, wherever the run started) when it can
    assert step_range(20, None, None, first=0) == (5, 20)
    assert step_range(120, None, None, first=100) == (105, 120)
    assert step_range(500, None, None, first=0) == (500 - DEFAULT_STEPS + 1, 500)
    assert step_range(3, None, None, first=0) == (0, 3)  # nothing past the warm-up yet: all of it
    assert step_range(20, 2, None, first=0) == (2, 20)  # a range asked for keeps its warm-up
    with pytest.raises(Invalid) as error:
        step_range(9, 5, 2)
    assert error.value.field == ("from_step",)


def test_a_big_runs_ranges_are_bounded_by_cells_not_only_steps() -> None:
    """Scoring costs per rank × step: the default range of a big run holds fewer steps (at least 10),
    and a range asked for at most 2 million cells."""
    from bubblescope.backend.derived.stragglers import DEFAULT_CELLS, MAX_CELLS, step_range
    from bubblescope.backend.errors import Invalid

    assert step_range(500, None, None, ranks=1024) == (401, 500)  # 100 steps: 102,400 cells
    assert step_range(500, None, None, ranks=4096) == (500 - DEFAULT_CELLS // 4096 + 1, 500)  # 40 steps
    assert step_range(500, None, None, ranks=16384) == (491, 500)  # 10 steps
    assert step_range(500, None, None, ranks=65536) == (491, 500)  # never fewer than 10
    assert step_range(5000, 10, None, ranks=16384) == (10, 10 + MAX_CELLS // 16384 - 1)
    assert step_range(500, 0, MAX_CELLS // 16384 - 1, ranks=16384) == (0, 121)
    with pytest.raises(Invalid) as error:
        step_range(500, 0, MAX_CELLS // 16384, ranks=16384)
    assert error.value.field == ("to_step",) and "more than 122 steps" in str(error.value)


def test_a_persistent_straggler_and_a_neighbours_hiccup_are_no_slow_host() -> None:
    """Rank 3 is persistently 1.55x; on steps 6 and 9 its host neighbour rank 2 is 1.15x its own
    median while the whole machine is 1.06x, so rank 2 is slow only against its own history. Rank 3
    (by peers) and rank 2 (by history) are flagged on the same steps, but on different footings:
    that is one straggler and a hiccup, not a slow host."""
    bump = {0: 1.06, 1: 1.06, 2: 1.15, 3: 1.55}
    slow = lambda r, s: bump[r] if s in (6, 9) else (1.55 if r == 3 else 1.0)
    report = find_stragglers(synthetic(4, 10, slow, jitter=0.005), two_hosts())
    rank2 = next(score for score in report.rank_scores if score.rank == 2)
    assert rank2.flagged_steps == []  # against the other ranks it is not slow ...
    assert [
        report.steps[j]
        for j, cell in enumerate(report.matrices["compute"].values_ns[2])
        if cell is not None and cell > 1.12 * 10_000_000
    ] == [6, 9]  # ... against itself it is
    assert report.rank_scores[3].verdict == "persistent"
    assert report.groups == []
    # both ranks of the host slow against their peers on those steps: that is a (one-off) slow host
    both = lambda r, s: 1.55 if r == 3 or (r == 2 and s in (6, 9)) else 1.0
    report = find_stragglers(synthetic(4, 10, both, jitter=0.005), two_hosts())
    assert [(g.group, g.flagged_steps, g.verdict) for g in report.groups] == [("h1", [6, 9], "one-off")]


def test_a_group_is_slow_together_only_by_comparable_amounts() -> None:
    """Rank 3 is 1.6x throughout; on step 6 its neighbour rank 2 is 1.15x, slow against the other
    ranks too. Both are flagged against their peers on step 6, but 0.15 of excess beside 0.6 is a
    hiccup beside a straggler, not a host slow as a whole."""
    slow = lambda r, s: 1.6 if r == 3 else (1.15 if r == 2 and s == 6 else 1.0)
    report = find_stragglers(synthetic(4, 10, slow, jitter=0.005), two_hosts())
    assert next(score for score in report.rank_scores if score.rank == 2).flagged_steps == [6]
    assert report.groups == []
    # the same hiccup at the straggler's size is the host slowing down as a whole
    even = lambda r, s: 1.6 if r == 3 or (r == 2 and s == 6) else 1.0
    assert [g.flagged_steps for g in find_stragglers(synthetic(4, 10, even, jitter=0.005), two_hosts()).groups] == [[6]]
