"""A persistent slow rank that is not what holds the step: two DDP ranks, rank 0 computing 20% longer, rank 1 spending
100 ms a step on the host before its backward (a slow transform, as the tour's late rank). The straggler view, on
compute, names rank 0; but rank 0 waits ~94 ms a step for rank 1 in the all-reduce, so draining rank 0's host would
leave the step as long. The report names rank 1 and suggests nothing for rank 0; with rank 1 on time (rank 0's extra
compute is then what rank 1 waits for) rank 0 stays the straggler to drain.

Figures in ms, so each expectation is the arithmetic in the docstrings, not a reading of the code."""

from __future__ import annotations

from bubblescope import analysis, wire
from bubblescope.analysis.run_report import straggler_notes
from bubblescope.analysis.stragglers import RankPlacement, RankStepTimes, StragglerReport, find_stragglers

MS = 1_000_000
FORWARD, BACKWARD, SLOWER, HOST_WORK, TRANSFER, OPTIMIZER = 10, 20, 1.2, 100, 5, 2
STEPS = range(10, 22)
PLACES = [analysis.RankPlace(rank, f"host{rank}", None, {}, 0) for rank in range(2)]
FACTS = analysis.RunFacts(world_size=2, config={}, places=PLACES)


def rank_spans(rank: int, step: int, host_work_ms: int) -> tuple[list[analysis.TimedSpan], tuple[int, int]]:
    """Rank 0: forward 12, backward 24 (1.2× rank 1's 10 + 20). Rank 1: forward 10, ``host_work_ms`` on the host,
    backward 20. The all-reduce ends TRANSFER after the later of the two ranks reaches it; then the optimizer."""
    t0 = step * 1000 * MS
    scale = SLOWER if rank == 0 else 1.0
    forward_end = t0 + int(FORWARD * scale * MS)
    backward_start = forward_end + (host_work_ms * MS if rank == 1 else 0)
    arrivals = (t0 + int((FORWARD + BACKWARD) * SLOWER * MS), t0 + (FORWARD + host_work_ms + BACKWARD) * MS)
    arrival = arrivals[rank]
    reduce_end = max(arrivals) + TRANSFER * MS
    spans = [
        analysis.TimedSpan(rank, "forward", t0, forward_end),
        analysis.TimedSpan(rank, "backward", backward_start, arrival),
        analysis.TimedSpan(rank, "all_reduce", arrival, reduce_end, name="ddp_bucket_0", group=wire.WORLD_GROUP),
        analysis.TimedSpan(rank, "optimizer", reduce_end, reduce_end + OPTIMIZER * MS),
    ]
    return spans, (t0, reduce_end + OPTIMIZER * MS)


def report(host_work_ms: int) -> tuple[analysis.RunReport, StragglerReport]:
    steps, rows = [], []
    for step in STEPS:
        spans, windows = [], {}
        for rank in range(2):
            own, windows[rank] = rank_spans(rank, step, host_work_ms)
            spans += own
            compute = sum(s.end_ns - s.start_ns for s in own if s.kind != "all_reduce")
            comm = sum(s.end_ns - s.start_ns for s in own if s.kind == "all_reduce")
            window = windows[rank][1] - windows[rank][0]
            rows.append(RankStepTimes(rank, step, window, compute, comm, comm, window - compute - comm))
        steps.append(analysis.break_down_step(analysis.StepRecord(step, spans, windows), PLACES))
    placements = [RankPlacement(p.rank, p.host) for p in PLACES]
    stragglers = find_stragglers(rows, placements)
    finding = stragglers.findings[0]
    # compute 36 against 30 ms on every step: rank 0 is persistently slow by 1.2× whoever waits for whom
    assert (finding.kind, finding.ranks, finding.verdict) == ("slow rank", [0], "persistent"), stragglers.findings
    window = analysis.StepWindow(list(STEPS), [], [])
    return analysis.analyse_run(FACTS, window, steps, stragglers=stragglers), stragglers


def test_the_slow_rank_that_waits_for_a_late_one_is_not_the_rank_to_drain() -> None:
    """Rank 1 reaches the all-reduce at 10 + 100 + 20 = 130 ms, rank 0 at 36: rank 0 waits 94 ms for it."""
    result, stragglers = report(HOST_WORK)
    culprit = result.step_split.culprit  # type: ignore[union-attr]
    assert culprit is not None and culprit.rank == 1 and culprit.victims == [0], culprit
    assert culprit.waited_on_by([0]) and not culprit.waited_on_by([1]) and not culprit.waited_on_by([])
    kinds = [s.kind for s in result.suggestions]
    assert "late_rank" in kinds and "drain_straggler" not in kinds, kinds
    late = next(s for s in result.suggestions if s.kind == "late_rank")
    assert "rank 1" in late.title, late.title
    assert straggler_notes(stragglers, culprit) == [] and len(straggler_notes(stragglers)) == 1


def test_the_slow_rank_others_wait_for_is_still_the_rank_to_drain() -> None:
    """Without the host work rank 1 reaches the all-reduce at 30 ms and waits 6 ms for rank 0 (36 ms)."""
    result, stragglers = report(0)
    culprit = result.step_split.culprit  # type: ignore[union-attr]
    assert culprit is not None and culprit.rank == 0 and culprit.victims == [1], culprit
    (note,) = straggler_notes(stragglers, culprit)
    assert (note.rank, note.host) == (0, "host0"), note
    # the late rank's fix drains host0 already: the straggler's own drain is not listed twice
    late = next(s for s in result.suggestions if s.kind == "late_rank")
    assert "rank 0 (host host0)" in late.title and late.apply == {"exclude_hosts": ["host0"]}, late
