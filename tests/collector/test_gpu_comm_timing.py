"""Communication on CUDA is timed on the GPU: NCCL collectives, DDP buckets and pipeline P2P.

With NCCL the host learns nothing at a collective's end: its future completes at launch and
``Work.wait`` only makes the current stream wait. So on a GPU these spans must come from CUDA
events (``gpu_timing``). Each test makes the GPU run far behind the host (tens of milliseconds
of matrix products launched in under one) and checks that the communication spans sit after the
GPU work they follow, where host times would put them inside it. Skips without CUDA and NCCL
(CI); the pipeline test needs two GPUs.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or not torch.distributed.is_nccl_available(), reason="no CUDA GPU with NCCL here"
)

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402

from bubblescope.collector.aggregate import step_aggregate  # noqa: E402
from bubblescope.collector.clock import local_ns  # noqa: E402
from bubblescope.collector.gpu_timing import CudaStepClock  # noqa: E402
from bubblescope.collector.recorder import Recorder, StepRecord  # noqa: E402
from tests.support import free_port  # noqa: E402

SLACK_NS = 50_000  # event resolution and the anchor's placement


@pytest.fixture
def nccl_world_of_one() -> Iterator[None]:
    dist.init_process_group("nccl", rank=0, world_size=1, store=dist.HashStore(), device_id=torch.device("cuda:0"))
    try:
        yield
    finally:
        dist.destroy_process_group()


def gpu_recorder(records: list[StepRecord]) -> Recorder:
    recorder = Recorder(records.append, lambda _n: None, 10_000)
    recorder.gpu = CudaStepClock()
    return recorder


def gpu_ns(anchor: tuple[Any, int], event: Any) -> int:
    """An event's time on the host clock, as ``gpu_timing.resolve`` computes it (``anchor`` as it
    placed it: ``StepRecord.gpu_anchor`` after ``step_aggregate``)."""
    return anchor[1] + int(anchor[0].elapsed_time(event) * 1e6)


def assert_ends_not_before_starts(record: StepRecord) -> None:
    """Before ``resolve`` clamps them: an end event recorded on a stream that did not wait for the
    op would fire at launch, long before its start event (queued behind the slow work)."""
    for _index, start, end, identity in record.gpu_events:
        end.synchronize()
        assert start.elapsed_time(end) >= -0.01, identity


#: About 50 ms of a 2 GHz GPU spinning before the measured step's forward, so the host runs far ahead of it.
GPU_HOLD_CYCLES = 100_000_000


def slow_gpu_work(a: Any, products: int = 20) -> Any:
    for _ in range(products):
        a = a @ a
        a = a / a.norm()
    return a


def test_nccl_collectives_are_timed_after_the_gpu_work_before_them_not_at_their_launch(
    nccl_world_of_one: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bubblescope.collector import collectives

    records: list[StepRecord] = []
    recorder = gpu_recorder(records)
    collectives.install(recorder)
    a = torch.randn(4096, 4096, device="cuda")
    gradients = torch.randn(16 * 2**20, device="cuda")
    torch.cuda.synchronize()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *_: pytest.fail("torch.cuda.synchronize in the hot path"))
    try:
        recorder.begin_step()
        with recorder.span("forward", on_gpu=True):
            a = slow_gpu_work(a)
        launched = local_ns()
        work = dist.all_reduce(gradients, async_op=True)
        dist.all_reduce(gradients[:1024])  # blocking
        work.wait()
        recorder.end_step()
    finally:
        monkeypatch.undo()
        collectives.detach()
    record = records[0]
    assert len(record.gpu_events) == 3  # the forward and the two all-reduces
    assert_ends_not_before_starts(record)
    step_aggregate(record)  # the shipper thread's part: resolves the events
    (forward,) = [row for row in record.spans if row[1] == "forward"]
    reduces = sorted((row for row in record.spans if row[1] == "all_reduce"), key=lambda row: row[7])
    assert [(row[7], row[8]) for row in reduces] == [(4096, "world"), (64 * 2**20, "world")]
    assert forward[3] > launched + 5_000_000, "the GPU was meant to run far behind the host"
    for row in reduces:
        assert row[2] >= forward[3] - SLACK_NS, (row, forward)  # issued behind the forward on its stream
        assert row[3] >= row[2]


def test_ddp_buckets_on_nccl_are_timed_after_the_backward_kernels_that_fill_them(nccl_world_of_one: None) -> None:
    from torch.nn.parallel import DistributedDataParallel

    from bubblescope.collector.integrations import instrument_ddp

    records: list[StepRecord] = []
    recorder = gpu_recorder(records)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(4096, 4096) for _ in range(4)]).cuda()
    ddp = DistributedDataParallel(model, device_ids=[0], bucket_cap_mb=25)
    instrument_ddp(ddp, recorder, None, None)
    inputs = torch.randn(8192, 4096, device="cuda")
    forward_done = torch.cuda.Event(enable_timing=True)
    launched: list[int] = []
    # DDP builds its buckets in the first step and rebuilds them (a host sync) in the second: the third is measured,
    # with torch's sync debug mode on, so a failure names any call that made the host wait for the GPU.
    for step in range(3):
        measured = step == 2
        with warnings.catch_warnings(record=True) as synced:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn" if measured else "default")
            try:
                recorder.begin_step()
                if measured:  # the host outruns the GPU on its own only where launches are cheap (an H200 did not)
                    torch.cuda._sleep(GPU_HOLD_CYCLES)
                loss = ddp(inputs).square().mean()
                forward_done.record()
                loss.backward()
                launched.append(local_ns())
            finally:
                torch.cuda.set_sync_debug_mode("default")
        recorder.end_step()
    host_waits = [str(w.message).splitlines()[0] for w in synced]
    record = records[2]
    assert record.gpu_anchor is not None and len(record.gpu_events) >= 4
    assert_ends_not_before_starts(record)
    step_aggregate(record)
    anchor = record.gpu_anchor  # as placed by the resolve
    buckets = [row for row in record.spans if row[1] == "all_reduce"]
    assert len(buckets) >= 4 and all(row[9].startswith("ddp_bucket_") for row in buckets)
    forward_end = gpu_ns(anchor, forward_done)
    assert forward_end > anchor[1] + 5_000_000, "the forward was meant to take tens of ms on the GPU"
    assert launched[2] < forward_end, ("the GPU was meant to run far behind the host", host_waits)
    for row in buckets:
        assert row[2] >= forward_end - SLACK_NS, (row, forward_end)  # after the backward began on the GPU
        assert row[3] >= row[2]


def _pipeline_rank(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from bubblescope.collector import pipelining

    device = torch.device(f"cuda:{rank}")
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=rank, world_size=2, device_id=device)
    try:
        records: list[StepRecord] = []
        recorder = gpu_recorder(records)
        torch.manual_seed(0)
        layers = 8 if rank == 0 else 1  # stage 0 is slow: stage 1's recvs wait on it
        model = nn.Sequential(*[nn.Linear(4096, 4096) for _ in range(layers)]).to(device)
        stage = PipelineStage(model, rank, 2, device)
        schedule = Schedule1F1B(stage, n_microbatches=4, loss_fn=nn.functional.mse_loss)
        pipelining.instrument_schedule(schedule, recorder)
        inputs, targets = torch.randn(4 * 2048, 4096, device=device), torch.randn(4 * 2048, 4096, device=device)
        for _ in range(2):
            dist.barrier()
            torch.cuda.synchronize()
            with recorder.step():
                if rank == 0:
                    schedule.step(inputs)
                else:
                    schedule.step(target=targets)
        pipelining.detach()
        step_aggregate(records[1])
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps([list(row) for row in records[1].spans]))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # a 2-rank pipeline job (torch.multiprocessing, NCCL)
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="a two-stage NCCL pipeline needs two GPUs")
def test_pipeline_recvs_on_nccl_last_while_the_previous_stage_computes(tmp_path: Path) -> None:
    mp.spawn(_pipeline_rank, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    rows = {rank: json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)}
    producer = {row[5]: row for row in rows[0] if row[1] == "forward"}
    recvs = {row[5]: row for row in rows[1] if row[1] == "recv" and row[9] == "fwd"}
    consumer = {row[5]: row for row in rows[1] if row[1] == "forward"}
    assert sorted(recvs) == sorted(consumer) == [0, 1, 2, 3]
    first_forward_ns = producer[0][3] - producer[0][2]
    assert recvs[0][3] - recvs[0][2] >= first_forward_ns / 2, (recvs[0], producer[0])  # waited for stage 0
    for microbatch, recv in recvs.items():
        assert recv[3] <= consumer[microbatch][2] + SLACK_NS, (recv, consumer[microbatch])  # data before use
    sends = [row for row in rows[0] if row[1] == "send" and row[9] == "fwd"]
    assert len(sends) == 4 and all(row[3] >= row[2] for row in sends)
