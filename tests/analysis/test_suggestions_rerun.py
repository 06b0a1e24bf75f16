"""Suggestions for real jobs, applied as they say and re-run: the re-run changed what the suggestion
said it would change.

Each test runs a base job, takes the suggestion, applies its ``apply`` keys as written and runs
that once. What is checked is what the change does inside the re-run, read from the re-run's
own spans, not its step time against the base's: on this shared 2-core machine a job whose two
ranks compute at the same time (every suggestion here makes them do so) slows down whenever
anything else runs, so a wall-time comparison of two runs measures the machine (trial runs of
the rebalanced job took 600-700 ms against 310-390 ms for its base while the machine was busy,
and 185-211 against 206-253 ms when it was quiet). Whether the applied suggestions make the
step faster, and by how much against their predictions, is ``bench/simulator_validation.py
--suggestions``'s figure.
"""

from __future__ import annotations

import statistics
from typing import Any

import httpx
import pytest

from bubblescope import intervals
from bubblescope.demo_job import DEFAULT_BATCH_SIZE, DEFAULT_HIDDEN
from tests.analysis.replay_support import JobShape, run_and_analyse
from tests.support import LiveServer

pytestmark = [pytest.mark.slow, pytest.mark.timing]
COMPUTE = ("forward", "backward")


def compute_overlap(client: httpx.Client, run_key: str, steps: list[int]) -> float:
    """Median over ``steps`` of the time both ranks compute at once, as a fraction of the less busy
    rank's compute time (aligned spans; 0: the ranks take turns, 1: one computes only while the
    other does). A ratio of times within each step, so the machine's speed does not move it."""
    overlaps = []
    for step in steps:
        spans = client.get(f"/api/v1/runs/{run_key}/steps/{step}").json()["spans"]
        compute = [
            intervals.merge([(s["start_ns"], s["end_ns"]) for s in spans if s["rank"] == rank and s["kind"] in COMPUTE])
            for rank in (0, 1)
        ]
        shorter = min(intervals.total_length(c) for c in compute)
        overlaps.append(intervals.intersect_length(*compute) / shorter)
    return statistics.median(overlaps)


def causes(analysis: dict[str, Any]) -> dict[str, float]:
    """Each bubble cause as a fraction of its own run's step."""
    return {c["name"]: c["fraction_of_step"] for c in analysis["attribution"]["causes"]}


def test_naive_model_parallelism_pipelined_as_suggested_overlaps_the_stages(sqlite_server: LiveServer) -> None:
    """Layer-wise model parallelism keeps one rank computing at a time; the suggestion (1F1B with
    m micro-batches) predicts a shorter step because the ranks then compute at once. The re-run,
    configured by the suggestion's ``apply`` as written, is that pipeline, and its ranks do
    compute at once: over a tenth of the less busy rank's compute time (trial runs: 0.32-0.65 on an idle
    machine; 0.17 once on a loaded CI machine, where the two ranks share two cores with the service),
    where the base's ranks never overlap (0 on every step).

    At the demo job's batch (one micro-batch of 256 samples) and twice its hidden size (1024), where the
    lesson's bubble must show: (p-1)/p = 50% less the time both ranks spend outside the pipeline. At the
    README's hidden 512 the stage work is 3-6 ms an action beside the CPU runtime's 0.5-0.7 ms: a loaded CI
    machine inflated that cost until no fix was predicted (and once read the bubble 0.29 over 3 steps).
    Twelve steps, so the medians are over 7 past the warm-up."""
    client = sqlite_server.client()
    base = JobShape("naive", 1, (2, 2), microbatch_size=DEFAULT_BATCH_SIZE, hidden=2 * DEFAULT_HIDDEN, steps=12)
    base_key, before = run_and_analyse(sqlite_server.url, client, base)
    top = before["suggestions"][0]
    assert top["kind"] == "pipeline_naive_split"
    assert top["apply"]["schedule"] == "1f1b" and top["apply"]["num_microbatches"] >= 2
    assert top["apply"]["num_microbatches"] * top["apply"]["microbatch_size"] == base.microbatch_size
    assert "Schedule1F1B" in top["torch_pipelining"]
    assert top["predicted_step_ns"] < top["current_step_ns"] and top["gain_fraction"] > 0.01
    assert before["attribution"]["measured_bubble_fraction"] > 0.35  # p-1 of p idle, less the shared steps
    assert compute_overlap(client, base_key, before["steps"]) < 0.02

    after_key, after = run_and_analyse(sqlite_server.url, client, base.applied(top["apply"]))
    setup = after["pipeline"]["setup"]
    assert (setup["schedule"], setup["microbatches"]) == ("1f1b", top["apply"]["num_microbatches"])
    assert compute_overlap(client, after_key, after["steps"]) > 0.1


def test_imbalanced_pipeline_rebalanced_as_suggested_has_balanced_stages(sqlite_server: LiveServer) -> None:
    """Five layers against one: stage 0 is the slowest by far, and the suggestion moves 2 layers.
    The layers are timed one by one: the first layer of stage 0 costs about two thirds of the others (it
    computes no input gradient: 4.6 against 6.7-8.0 ms here), the stages' own work (runtime, loss) stays
    where it is, and the suggestion states the excess the move leaves (8% in a quiet trial). The re-run
    with the suggested split comes within that bound plus 15 points (a quiet trial read 0.9%; the base
    63%): stage costs are medians of each stage's forward and backward spans within the run, but a loaded
    2-core machine does not stretch the two ranks alike (a CI run once read 17.8%, when the split counted
    layers rather than time). The imbalance's share of the step falls to at most half the base's where the suggested
    move is 3+3; where timings suggested 4+2 (one layer moved), it falls. Without a rebalance suggestion the failure
    says what the analysis saw."""
    client = sqlite_server.client()
    # Large layers, so that the compute outweighs each action's fixed cost
    base = JobShape("1f1b", 4, (5, 1), microbatch_size=64, hidden=1280, steps=8)
    _, before = run_and_analyse(sqlite_server.url, client, base)
    rebalance = next((s for s in before["suggestions"] if s["kind"] == "rebalance_stages"), None)
    said = [s["kind"] for s in before["suggestions"]], before["imbalance"], before["pipeline_unavailable"]
    assert rebalance is not None, said
    assert before["layers_source"] == "counted"  # the job declared no layer split: the collector counted it
    # 3+3 on a quiet machine; 4+2 once in CI, where load stretched the measured layers unevenly: either is a
    # move of time off stage 0, and the re-run below checks the one suggested
    split = rebalance["apply"]["layers_per_stage"]
    assert split in ([3, 3], [4, 2]), rebalance["apply"]
    assert rebalance["predicted_step_ns"] < rebalance["current_step_ns"]
    # the move takes most of the excess off stage 0 (quiet trials: 8-11 ms of 11-12, against a 3-4 ms band; a loaded
    # CI run's band was wider than the cut): named whatever the band, which is measured
    cut, excess = before["imbalance"]["balanced_cut_ns"], before["imbalance"]["excess_ns"]
    assert cut >= excess / 2 and before["imbalance"]["noise_ns"] > 0, before["imbalance"]
    assert before["imbalance"]["slowest_stage"] == 0 and before["imbalance"]["slowest_excess"] > 0.3
    assert before["imbalance"]["moves"] == [{"layers": 5 - split[0], "from_stage": 0, "to_stage": 1}]
    assert causes(before)["stage_imbalance"] > 0.05
    timed = before["pipeline"]["stage_layers"]
    assert [len(stage) for stage in timed["layers"]] == [5, 1], timed  # each Linear + GELU timed as one layer
    first, *others = [c["forward_ns"] + c["backward_ns"] for c in timed["layers"][0]]
    assert first < min(others), timed  # no input gradient: the measured layers show it, an even spread would not
    predicted = before["imbalance"]["balanced_excess"]
    assert predicted is not None and f"predicted {predicted:.0%} above the mean" in rebalance["evidence"]
    # A schedule with 2 stages per rank (offered only when the measured bubble calls for it) comes
    # with its own split of the layers into 4 stages, so that it can be applied exactly as predicted
    for switch in (s for s in before["suggestions"] if s["kind"] == "better_schedule"):
        assert len(switch["apply"]["layers_per_stage"]) == 4 and sum(switch["apply"]["layers_per_stage"]) == 6

    _, after = run_and_analyse(sqlite_server.url, client, base.applied(rebalance["apply"]))
    assert after["imbalance"]["layers_per_stage"] == split
    shares = (causes(before)["stage_imbalance"], causes(after)["stage_imbalance"])
    if split == [3, 3]:
        assert after["imbalance"]["slowest_excess"] <= predicted + 0.15, (predicted, after["imbalance"])
        assert shares[1] <= shares[0] / 2, shares
    else:  # suggested from load-stretched timings (a fresh-clone CI: 4+2 predicted 13.7% above the mean, re-run 28.7%):
        # the re-run is less unbalanced than the base, not near what those timings predicted, and the one layer moved
        # does not halve the imbalance's share of the step (2026-12-01, idle: 0.10 → 0.08, 0.12 → 0.07 in two of five)
        excess = (before["imbalance"]["slowest_excess"], after["imbalance"]["slowest_excess"])
        assert excess[1] < excess[0] and shares[1] < shares[0], (predicted, excess, shares)
    # The re-run converges on 3+3. After 3+3 nothing is left to move: a move is named only when it cuts the
    # slowest stage by more than that stage's median cost is known to (a loaded CI re-run once read stage 1 14%
    # above the mean after 3+3 and named 4+2, which would have left stage 0 about as far above it). After a
    # load-distorted 4+2 (four layers against two and the loss) the re-run's own timings may finish the job, and
    # then only by moving back to 3+3 (quiet: a 3.5 ms cut against a 3.1 ms band; loaded: 0.1 against 7.0, none)
    again = [s["apply"]["layers_per_stage"] for s in after["suggestions"] if s["kind"] == "rebalance_stages"]
    allowed = ([],) if split == [3, 3] else ([], [[3, 3]])
    assert again in allowed, (split, again, after["imbalance"])
