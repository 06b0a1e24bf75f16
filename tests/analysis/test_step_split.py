"""A data-parallel job's steps on plain data, without a database, through the analysis' entry point: four ranks,
each loading its batch, computing forward and backward, then all-reducing its gradients over "world" and
stepping its optimizer. Rank 3 computes longer, so the other three wait for it inside the all-reduce.

The figures are built in ms, so each expected value is the arithmetic below, not a reading of the code."""

from __future__ import annotations

import pytest

from bubblescope import analysis, wire

MS = 1_000_000
WORLD = 4
LATE = 3
DATA, FORWARD, BACKWARD, LATE_EXTRA, TRANSFER, OPTIMIZER, GAP = 2, 10, 20, 6, 4, 3, 1


def rank_spans(rank: int, step: int, instrumented: bool = True) -> tuple[list[analysis.TimedSpan], tuple[int, int]]:
    """One rank's step: data loading, forward, backward (longer on the late rank), the all-reduce (waiting for
    the late rank to arrive, then the transfer), a host gap, the optimizer."""
    t0 = step * 100 * MS
    compute_end = t0 + (DATA + FORWARD + BACKWARD + (LATE_EXTRA if rank == LATE else 0)) * MS
    arrival = t0 + (DATA + FORWARD + BACKWARD + LATE_EXTRA) * MS  # the late rank's start: the call's last
    reduce_end = arrival + TRANSFER * MS
    spans = [analysis.TimedSpan(rank, "data_loading", t0, t0 + DATA * MS)]
    if instrumented:
        spans += [
            analysis.TimedSpan(rank, "forward", t0 + DATA * MS, t0 + (DATA + FORWARD) * MS),
            analysis.TimedSpan(rank, "backward", t0 + (DATA + FORWARD) * MS, compute_end),
        ]
    spans.append(
        analysis.TimedSpan(rank, "all_reduce", compute_end, reduce_end, name="ddp_bucket_0", group=wire.WORLD_GROUP)
    )
    optimizer_start = reduce_end + GAP * MS
    spans.append(analysis.TimedSpan(rank, "optimizer", optimizer_start, optimizer_start + OPTIMIZER * MS))
    return spans, (t0, optimizer_start + OPTIMIZER * MS)


def record(step: int, instrumented: bool = True) -> analysis.StepRecord:
    spans, windows = [], {}
    for rank in range(WORLD):
        own, windows[rank] = rank_spans(rank, step, instrumented)
        spans += own
    return analysis.StepRecord(step, spans, windows)


PLACES = [analysis.RankPlace(rank, f"host{rank}", None, {}, 0) for rank in range(WORLD)]
FACTS = analysis.RunFacts(world_size=WORLD, config={}, places=PLACES)


def report(instrumented: bool = True) -> analysis.RunReport:
    steps = [analysis.break_down_step(record(step, instrumented), PLACES) for step in range(10, 20)]
    window = analysis.StepWindow(list(range(10, 20)), [], [])
    return analysis.analyse_run(FACTS, window, steps)


def test_the_step_is_split_into_the_jobs_own_parts_and_adds_up_to_the_window() -> None:
    result = report()
    split = result.step_split
    assert split is not None and result.attribution is None and result.pipeline_unavailable is None
    window = (DATA + FORWARD + BACKWARD + LATE_EXTRA + TRANSFER + GAP + OPTIMIZER) * MS  # every rank's
    assert split.window_ns == pytest.approx(window)
    parts = {p.name: p.ns for p in split.parts}
    assert sum(parts.values()) == pytest.approx(window)
    # compute: forward + backward, the late rank's 6 ms more, mean over the four ranks
    assert parts["model_compute"] == pytest.approx((FORWARD + BACKWARD + LATE_EXTRA / WORLD) * MS)
    assert parts["data_loading"] == pytest.approx(DATA * MS)
    assert parts["optimizer"] == pytest.approx(OPTIMIZER * MS)
    # three ranks wait 6 ms for the late one: 4.5 ms a rank; every rank transfers 4 ms
    assert parts["collective_wait"] == pytest.approx(LATE_EXTRA * (WORLD - 1) / WORLD * MS)
    assert parts["collective_transfer"] == pytest.approx(TRANSFER * MS)
    assert parts["host_gaps"] == pytest.approx(GAP * MS)
    (group,) = split.groups
    assert group.group == wire.WORLD_GROUP and group.wait_ns + group.transfer_ns == pytest.approx(group.exposed_ns)


def test_the_late_rank_is_named_with_the_ranks_that_wait_for_it_and_priced_by_their_lateness() -> None:
    result = report()
    split = result.step_split
    assert split is not None and split.culprit is not None
    assert split.culprit.rank == LATE and split.culprit.host == f"host{LATE}"
    assert split.culprit.victims == [0, 1, 2] and split.culprit.share == pytest.approx(1.0)
    late = next(s for s in result.suggestions if s.kind == "late_rank")
    assert "rank 3 (host host3)" in late.title
    # without the late rank's 6 ms, every rank's step is 6 ms shorter (the mean wait, 4.5 ms, would undercount:
    # the late rank's own extra work is the same delay)
    assert late.current_step_ns - late.predicted_step_ns == pytest.approx(LATE_EXTRA * MS)
    overlap = next(s for s in result.suggestions if s.kind == "overlap_dp_communication")
    assert overlap.current_step_ns - overlap.predicted_step_ns == pytest.approx(TRANSFER * MS)
    assert [s.gain_fraction for s in result.suggestions] == sorted(
        (s.gain_fraction for s in result.suggestions), reverse=True
    )
    assert not any("bubble" in s.title.lower() for s in result.suggestions)


def test_a_run_that_recorded_no_compute_says_so_and_suggests_nothing() -> None:
    """Only the all-reduce, data loading and optimizer spans, as instrument_ddp recorded before it timed the
    model: the forward and backward read as host gaps, and no fix is priced on that."""
    result = report(instrumented=False)
    split = result.step_split
    assert split is not None and not split.compute_instrumented
    assert split.not_instrumented is not None and "collector.instrument_model(model)" in split.not_instrumented
    assert result.suggestions == []


def test_steps_without_spans_are_read_from_their_aggregates_and_split_as_the_spanned_ones() -> None:
    """Step 10 in full; steps 11-19 as their aggregates only (compute, comm, exposed comm, idle per rank)."""
    full = record(10)
    steps = [analysis.break_down_step(full, PLACES)]
    for step in range(11, 20):
        spans_of = record(step).spans
        windows = record(step).windows
        totals = []
        for rank in range(WORLD):
            own = [(s.kind, s.start_ns, s.end_ns) for s in spans_of if s.rank == rank]
            split = analysis_split(own, *windows[rank])
            totals.append(analysis.RankTotals(rank, *split))
        steps.append(analysis.break_down_step(analysis.StepRecord(step, [], windows, totals), PLACES))
    for step in steps[1:]:
        assert all(not b.from_spans and b.compute_ns > 0 for b in step.breakdowns)
    window = analysis.StepWindow(list(range(10, 20)), [], [], from_aggregates=list(range(11, 20)))
    result = analysis.analyse_run(FACTS, window, steps)
    assert result.steps_from_aggregates == list(range(11, 20))
    assert result.step_split is not None
    parts = {p.name: p.ns for p in result.step_split.parts}
    expected = {p.name: p.ns for p in report().step_split.parts}  # type: ignore[union-attr]
    assert parts == pytest.approx(expected, rel=1e-6)


def analysis_split(spans: list[tuple[str, int, int]], lo: int, hi: int) -> tuple[int, int, int, int]:
    """The collector's own per-step totals (``bubblescope.timesplit``): compute, comm, exposed comm, idle."""
    from bubblescope.timesplit import split_window

    split = split_window(spans, lo, hi)
    return split.compute_ns, split.comm_ns, split.exposed_comm_ns, split.idle_ns


def test_choose_steps_takes_a_short_runs_steps_without_spans_past_the_warm_up() -> None:
    seen = [analysis.StepSeen(step, 2, 10 * MS, step % 10 == 0) for step in range(12)]
    window = analysis.choose_steps(seen, 2)
    assert window.steps == list(range(5, 12)) and window.from_aggregates == [5, 6, 7, 8, 9, 11]
    long_run = [analysis.StepSeen(step, 2, 10 * MS, step % 10 == 0) for step in range(200)]
    assert analysis.choose_steps(long_run, 2).from_aggregates == []  # 19 steps with spans past the warm-up
