"""The CUDA-event path: GPU work is timed on its stream, never synchronised on the training
thread, and resolved to host time by the shipper. Skips where no GPU is present (CI)."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")


def test_a_gpu_span_measures_the_kernels_not_their_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    from bubblescope.collector.aggregate import step_aggregate
    from bubblescope.collector.gpu_timing import CudaStepClock
    from bubblescope.collector.recorder import Recorder, StepRecord

    records: list[StepRecord] = []
    recorder = Recorder(records.append, lambda _n: None, 1000)
    recorder.gpu = CudaStepClock()
    a = torch.randn(4096, 4096, device="cuda")
    a = (a @ a) / a.norm()  # cuBLAS and the kernels load here (hundreds of ms), not inside the timed launch
    torch.cuda.synchronize()
    reference_start, reference_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def forbidden(*_args: object) -> None:
        raise AssertionError("torch.cuda.synchronize on the training thread")

    monkeypatch.setattr(torch.cuda, "synchronize", forbidden)
    launched = time.perf_counter()
    recorder.begin_step()
    with recorder.span("forward", on_gpu=True, microbatch=0):
        reference_start.record()
        for _ in range(20):
            a = a @ a
            a = a / a.norm()
        reference_end.record()
    recorder.end_step()
    launch_s = time.perf_counter() - launched
    monkeypatch.undo()

    record = records[0]
    step_aggregate(record)  # what the shipper thread does: resolves the events
    (row,) = [r for r in record.spans if r[1] == "forward"]
    gpu_ms = (row[3] - row[2]) / 1e6
    reference_ms = reference_start.elapsed_time(reference_end)
    assert gpu_ms == pytest.approx(reference_ms, rel=0.05, abs=0.05)
    assert gpu_ms > 2 * launch_s * 1e3, (gpu_ms, launch_s)  # the kernels ran long after their launch


def test_a_step_begun_while_the_gpu_lags_is_placed_by_the_span_queued_after_the_host_waited() -> None:
    """The anchor event is queued behind tens of ms of earlier work, so the GPU reaches it long
    after the host recorded it. The span queued after ``.item()`` (the host waited for the GPU)
    cannot have run before it was queued: resolving places the step by it, not by the anchor's
    host time, which would put every span of the step that lag early."""
    from bubblescope.collector.aggregate import step_aggregate
    from bubblescope.collector.clock import local_ns
    from bubblescope.collector.gpu_timing import CudaStepClock
    from bubblescope.collector.recorder import Recorder, StepRecord

    records: list[StepRecord] = []
    recorder = Recorder(records.append, lambda _n: None, 1000)
    recorder.gpu = CudaStepClock()
    a = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    for _ in range(20):  # the last step's work, still queued when this step begins
        a = a @ a
        a = a / a.norm()
    begun = local_ns()
    recorder.begin_step()
    with recorder.span("forward", on_gpu=True, microbatch=0):
        a = a @ a
    a.sum().item()  # the loop's loss.item(): the host waits for the GPU
    queued = local_ns()
    with recorder.span("optimizer", on_gpu=True):
        a = a * 0.5
    finished = local_ns()
    recorder.end_step()

    record = records[0]
    totals = step_aggregate(record)
    forward, optimizer = (next(r for r in record.spans if r[1] == kind) for kind in ("forward", "optimizer"))
    assert queued - begun > 5_000_000, "the GPU was meant to run far behind the host"
    assert queued - 100_000 <= optimizer[2] <= finished + 1_000_000, (optimizer, queued, finished)
    # The forward ran after the queued work drained, not when the step began on the host.
    lag = forward[2] - begun
    assert lag > 5_000_000 and forward[3] <= optimizer[2], (forward, begun)
    # The step's window begins where its GPU work does: the lag is the last step's, not idle here.
    assert totals["idle_ns"] < lag / 4, (totals, lag)
