"""Suggestions for real jobs, applied as they say and re-run: faster, and within 15% of their prediction."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import pytest

from tests.analysis.replay_support import JobShape, run_and_analyse
from tests.support import LiveServer

pytestmark = pytest.mark.slow

TOLERANCE = 0.15


@dataclass(frozen=True)
class Rerun:
    """Medians over the alternating runs: base step, changed step, and the suggestion's prediction
    as each base run's analysis made it (one run's measurement drifts with the machine; so does a
    prediction drawn from it)."""

    before_ns: float
    after_ns: float
    predicted_ns: float
    runs: str  # every run's step in ms, in the order run, for the report


def apply_top_and_rerun(server: LiveServer, base: JobShape, pairs: int = 5) -> tuple[dict, dict, Rerun]:
    """The first run's analysis, its top suggestion, and that suggestion applied and re-run."""
    client = server.client()
    _, before = run_and_analyse(server.url, client, base)
    assert before["suggestions"], f"no suggestion for {base.label}: {before['attribution']}"
    top = before["suggestions"][0]
    return before, top, rerun(server, base, before, top, pairs)


def assert_paid_off_in_one_of_two_rounds(
    server: LiveServer, base: JobShape, suggestion: dict, first: Rerun, pairs: int = 5
) -> None:
    """``assert_paid_off`` on the first round of re-runs, or else on a second, fresh one.

    The changed job keeps both ranks busy on this 2-core machine, where the base job leaves one
    mostly idle, so a busy spell of anything else on the machine slows the changed side alone:
    one CI round measured the balanced split at 227.5 ms against 222.2 ms before (predicted
    182.7 ms), where quiet rounds give 185-211 ms against 206-253 ms. A suggestion that does not
    pay off misses both rounds and still fails.
    """
    try:
        assert_paid_off(suggestion, first)
    except AssertionError as missed:
        print(f"first round missed ({missed}); one more round")
        _, before = run_and_analyse(server.url, server.client(), base)
        assert_paid_off(suggestion, rerun(server, base, before, suggestion, pairs))


def rerun(server: LiveServer, base: JobShape, before: dict, suggestion: dict, pairs: int) -> Rerun:
    """Base and changed job ``pairs`` times each, alternating (``before`` is the first base run).

    Each side's figure is the median of its runs: this 2-core machine drifts by ~10% from one run
    to the next and now and then one run takes far longer; alternating keeps the drift off the
    before/after comparison and the median keeps up to two slow runs a side out of it (with three
    runs a side, one CI run landed 16% off: a slow base run and a fast changed one, 247 vs 186 ms).
    """
    client = server.client()
    target = base.applied(suggestion["apply"])
    befores, after_runs = [before], []
    for index in range(pairs):
        after_runs.append(run_and_analyse(server.url, client, target)[1]["step_ns"])
        if index + 1 < pairs:
            befores.append(run_and_analyse(server.url, client, base)[1])
    predicted = [
        s["predicted_step_ns"]
        for analysis in befores
        for s in analysis["suggestions"]
        if s["apply"] == suggestion["apply"]
    ]
    runs = ", ".join(f"{b['step_ns'] / 1e6:.0f}/{a / 1e6:.0f}" for b, a in zip(befores, after_runs))
    return Rerun(
        statistics.median(b["step_ns"] for b in befores),
        statistics.median(after_runs),
        statistics.median(predicted),
        runs,
    )


def assert_paid_off(suggestion: dict, measured: Rerun) -> None:
    report = (
        f"before {measured.before_ns / 1e6:.1f} ms, predicted {measured.predicted_ns / 1e6:.1f} ms, "
        f"after {measured.after_ns / 1e6:.1f} ms ({suggestion['title']}); runs before/after: {measured.runs} ms"
    )
    print(report)
    assert measured.after_ns < measured.before_ns, report
    assert abs(measured.predicted_ns - measured.after_ns) / measured.after_ns <= TOLERANCE, report


def test_naive_model_parallelism_pipelined_as_suggested(sqlite_server: LiveServer) -> None:
    # Large enough that each pipelined action's fixed cost (~1 ms of runtime on this CPU) stays small
    base = JobShape("naive", 1, (2, 2), microbatch_size=512, hidden=1024, steps=10)
    before, top, measured = apply_top_and_rerun(sqlite_server, base)
    assert top["kind"] == "pipeline_naive_split"
    assert top["apply"]["schedule"] == "1f1b" and top["apply"]["num_microbatches"] >= 2
    assert "Schedule1F1B" in top["torch_pipelining"]
    assert before["attribution"]["measured_bubble_fraction"] > 0.3  # p-1 of p idle, less the shared steps
    assert_paid_off_in_one_of_two_rounds(sqlite_server, base, top, measured)


def test_imbalanced_pipeline_rebalanced_as_suggested(sqlite_server: LiveServer) -> None:
    # Large layers, so that compute outweighs what two busy ranks on 2 cores cost each other
    # (gloo's transfer threads and the schedule's own work get less CPU than in the imbalanced run)
    base = JobShape("1f1b", 4, (5, 1), microbatch_size=64, hidden=1280, steps=10)
    before, top, measured = apply_top_and_rerun(sqlite_server, base)
    rebalance = next(s for s in before["suggestions"] if s["kind"] == "rebalance_stages")
    assert rebalance["apply"] == {"layers_per_stage": [3, 3]}
    assert before["imbalance"]["slowest_stage"] == 0
    assert before["imbalance"]["moves"] == [{"layers": 2, "from_stage": 0, "to_stage": 1}]
    causes = {c["name"]: c["ns"] for c in before["attribution"]["causes"]}
    assert causes["stage_imbalance"] > 0
    assert_paid_off_in_one_of_two_rounds(sqlite_server, base, top, measured)
    # A schedule with 2 stages per rank (offered only when the measured bubble calls for it) comes
    # with its own split of the layers into 4 stages, so that it can be applied (and re-run above
    # when it ranks first) exactly as predicted
    for switch in (s for s in before["suggestions"] if s["kind"] == "better_schedule"):
        assert len(switch["apply"]["layers_per_stage"]) == 4 and sum(switch["apply"]["layers_per_stage"]) == 6
