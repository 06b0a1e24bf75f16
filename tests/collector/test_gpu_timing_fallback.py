"""Where no CUDA event can be recorded (a CUDA graph being captured, or CUDA failing, as with
this machine's CPU build of torch), a GPU-timed span keeps its host times and nothing raises."""

from __future__ import annotations

import time

import pytest

from bubblescope.collector.aggregate import step_aggregate
from bubblescope.collector.clock import local_ns
from bubblescope.collector.gpu_timing import CudaStepClock
from bubblescope.collector.recorder import Recorder, StepRecord


def test_gpu_spans_keep_their_host_times_when_no_cuda_event_can_be_recorded() -> None:
    records: list[StepRecord] = []
    recorder = Recorder(records.append, lambda _n: None, 100)
    recorder.gpu = CudaStepClock()
    if recorder.gpu.mark() is not None:
        pytest.skip("CUDA records events here: the fallback is not reached")
    recorder.begin_step()
    before = local_ns()
    with recorder.span("forward", on_gpu=True, stage=0, microbatch=1):
        time.sleep(0.002)
    after = local_ns()
    recorder.extend_last("forward", 1, after + 1_000_000)  # the loss, as the last stage stretches it
    recorder.end_step()

    record = records[0]
    assert len(record.gpu_events) == 1
    totals = step_aggregate(record)  # resolving finds no readable event: host times stay
    (row,) = record.spans
    assert row[1] == "forward" and row[4:6] == (0, 1)
    assert before <= row[2] and row[2] + 2_000_000 <= after <= row[3] == after + 1_000_000
    assert totals["compute_ns"] >= 3_000_000


def test_the_anchor_is_placed_by_the_latest_bound_that_causality_gives() -> None:
    from bubblescope.collector.gpu_timing import anchor_host_ns

    # No span reveals a lag (each ran when queued, or later): the anchor's own host time.
    assert anchor_host_ns(1_000, [(1_500, 600), (2_000, 1_200)]) == 1_000
    # A span queued at 50_000, only 10_000 after the anchor on the GPU: the GPU reached the
    # anchor no earlier than 40_000, so it was 39_000 behind the host there.
    assert anchor_host_ns(1_000, [(1_500, 600), (50_000, 10_000), (51_000, 12_000)]) == 40_000
    # An event recorded before the anchor (an op issued in the last step, waited in this one)
    # bounds it as well.
    assert anchor_host_ns(1_000, [(900, -5_000)]) == 5_900
    assert anchor_host_ns(1_000, []) == 1_000
