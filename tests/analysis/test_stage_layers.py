"""A rebalance moves time: layers timed one by one, each stage's own work (loss, head, embedding) left where it
is. Plain data, no job: stage 0 holds 5 layers, stage 1 one layer and a loss worth two layers."""

from __future__ import annotations

import math

import pytest

from bubblescope import wire
from bubblescope.analysis.attribution import stage_imbalance
from bubblescope.analysis.model import TimedSpan
from bubblescope.analysis.pipeline_profile import MeasuredPipeline, StepSpans, measure_pipeline
from bubblescope.analysis.simulator import StageCost

MS = 1e6
LAYER_F, LAYER_B = 1 * MS, 2 * MS
LOSS_F, LOSS_B = 2 * MS, 4 * MS  # the last stage's own work: two layers' worth
CONFIG = {"schedule": "gpipe", "num_stages": 2, "num_microbatches": 1, "layers_per_stage": [5, 1]}


def stage_spans(stage: int, layers: int, start: float, own: tuple[float, float], timed: bool) -> list[TimedSpan]:
    """One micro-batch's forward and backward on ``stage`` (its rank), with each layer's spans inside."""
    forward = layers * LAYER_F + own[0]
    backward = layers * LAYER_B + own[1]
    out = [
        TimedSpan(stage, "forward", int(start), int(start + forward), stage, 0),
        TimedSpan(stage, "backward", int(start + forward), int(start + forward + backward), stage, 0),
    ]
    if timed:
        for layer in range(layers):
            name = wire.stage_layer_span_name(stage, f"layers.{stage * 5 + layer}")
            f0 = start + layer * LAYER_F
            b0 = start + forward + own[1] + (layers - 1 - layer) * LAYER_B
            out += [
                TimedSpan(stage, "forward", int(f0), int(f0 + LAYER_F), None, None, name=name),
                TimedSpan(stage, "backward", int(b0), int(b0 + LAYER_B), None, None, name=name),
            ]
    return out


def measured(timed: bool) -> MeasuredPipeline:
    spans = stage_spans(0, 5, 0, (0.0, 0.0), timed) + stage_spans(1, 1, 50 * MS, (LOSS_F, LOSS_B), timed)
    windows = {0: (0, int(100 * MS)), 1: (0, int(100 * MS))}
    return measure_pipeline([StepSpans(1, spans, windows)], CONFIG)


def test_timed_layers_give_each_layers_cost_and_the_loss_stays_the_last_stages_own_work() -> None:
    run = measured(timed=True)
    assert run.stage_layers is not None
    assert run.layer_costs == (StageCost(LAYER_F, LAYER_B),) * 6
    assert run.stage_layers.own == (StageCost(0.0, 0.0), StageCost(LOSS_F, LOSS_B))
    imbalance = stage_imbalance(run)
    assert imbalance.balanced_layers == (4, 2)  # 4 layers against 2 layers + the loss: 12 ms each
    assert imbalance.balanced_excess == pytest.approx(0.0, abs=1e-9)


def test_each_stages_noise_is_its_actions_spread_forward_and_backward_in_quadrature() -> None:
    """Five steps, stage 0's forward 10-14 ms and backward 20-28 ms: its noise is the 95% ranges of the two
    kinds' medians (1.96 x 1.4826 x MAD x sqrt(pi/2) / sqrt(5)) added in quadrature; stage 1, the same every
    step, has none. The spans of one identical step measure no spread either."""
    forwards, backwards = (10, 11, 12, 13, 14), (20, 22, 24, 26, 28)
    steps = []
    for step, (f, b) in enumerate(zip(forwards, backwards)):
        spans = [
            TimedSpan(0, "forward", 0, int(f * MS), 0, 0),
            TimedSpan(0, "backward", int(50 * MS), int((50 + b) * MS), 0, 0),
            TimedSpan(1, "forward", int(20 * MS), int(25 * MS), 1, 0),
            TimedSpan(1, "backward", int(30 * MS), int(40 * MS), 1, 0),
        ]
        steps.append(StepSpans(step, spans, {0: (0, int(100 * MS)), 1: (0, int(100 * MS))}))
    run = measure_pipeline(steps, {**CONFIG, "layers_per_stage": [3, 3]})
    one = 1.96 * 1.4826 * (math.pi / 2 / 5) ** 0.5  # MAD 1 ms forward, 2 ms backward
    assert run.stage_noise_ns == pytest.approx((one * MS * (1 + 4) ** 0.5, 0.0))
    assert measured(timed=False).stage_noise_ns == (0.0, 0.0)


def test_without_timed_layers_the_split_balances_layer_counts_and_says_what_it_leaves() -> None:
    """The even spread (the fitted fixed part of each action) takes the loss for layer cost: 3,3, which really
    leaves the last stage 9 + 6 ms against 9; the prediction, built on the same spread, cannot see it."""
    run = measured(timed=False)
    assert run.stage_layers is None
    imbalance = stage_imbalance(run)
    assert imbalance.balanced_layers == (3, 3)
    assert imbalance.balanced_excess is not None and imbalance.balanced_excess < 0.05


def test_layers_that_do_not_match_the_runs_counts_are_not_used() -> None:
    """Timed layers must be the layers the run counts (here the config says 4,2 while 5,1 were timed): else the
    even spread stands."""
    spans = stage_spans(0, 5, 0, (0.0, 0.0), True) + stage_spans(1, 1, 50 * MS, (LOSS_F, LOSS_B), True)
    windows = {0: (0, int(100 * MS)), 1: (0, int(100 * MS))}
    run = measure_pipeline([StepSpans(1, spans, windows)], {**CONFIG, "layers_per_stage": [4, 2]})
    assert run.stage_layers is None


def test_stage_layer_span_names_round_trip_and_other_names_are_not_layers() -> None:
    name = wire.stage_layer_span_name(12, "layers.40")
    assert wire.stage_layer_of(name) == (12, "layers.40")
    assert wire.block_of(name) == "stage12:layers.40"  # a block of its own on the per-block table
    for other in (None, "Transformer/layers.0", "pipeline/stagex:0", "pipeline/stage3:", "pipeline/stage3"):
        assert wire.stage_layer_of(other) is None, other


def test_named_layers_keep_their_forward_order_and_a_span_cut_by_a_wait_counts_whole() -> None:
    """A stage of named children (``fc``, ``attn``, ``head`` run in that order, not alphabetically) over 2
    micro-batches; the middle layer's backward cut in two by a blocking wait (two pieces of 1 ms for a 2 ms call)."""
    names = ("fc", "attn", "head")
    spans = [
        TimedSpan(0, "forward", 0, int(10 * MS), 0, 0),
        TimedSpan(0, "backward", int(10 * MS), int(30 * MS), 0, 0),
        TimedSpan(0, "forward", int(30 * MS), int(40 * MS), 0, 1),
        TimedSpan(0, "backward", int(40 * MS), int(60 * MS), 0, 1),
    ]
    for mb_start in (0, 30 * MS):
        for index, layer in enumerate(names):  # forward 1, 2, 3 ms; backward 2 ms each
            name = wire.stage_layer_span_name(0, layer)
            f0 = mb_start + sum(range(1, index + 1)) * MS
            spans.append(TimedSpan(0, "forward", int(f0), int(f0 + (index + 1) * MS), None, None, name=name))
            b0 = mb_start + 10 * MS + (2 - index) * 2 * MS
            pieces = [(b0, b0 + MS), (b0 + MS, b0 + 2 * MS)] if layer == "attn" else [(b0, b0 + 2 * MS)]
            spans += [TimedSpan(0, "backward", int(a), int(b), None, None, name=name) for a, b in pieces]
    config = {"schedule": "gpipe", "num_stages": 1, "num_microbatches": 2}
    run = measure_pipeline([StepSpans(1, spans, {0: (0, int(60 * MS))})], config)
    assert run.stage_layers is not None
    assert run.stage_layers.layers == (
        (StageCost(1 * MS, 2 * MS), StageCost(2 * MS, 2 * MS), StageCost(3 * MS, 2 * MS)),
    )
    assert run.stage_layers.own == (StageCost(4 * MS, 14 * MS),)  # 10 - 6 forward, 20 - 6 backward per micro-batch
