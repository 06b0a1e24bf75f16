"""The C hot path (``_hotpath``) records what the Python wrappers record.

Two real 2-rank jobs (``torch.multiprocessing``, gloo, CPU) of each of 1F1B and ZBV zero-bubble
run once on the C wrappers and once with ``BUBBLESCOPE_PURE_PYTHON=1``; every span row but the
times must agree. In-process cases then take both implementations through the paths a job
rarely shows: exceptions passing through, a full buffer, a paused recorder, blocked sends
stretched or continued, several recvs of one micro-batch merged.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from bubblescope.collector import native, pipelining
from bubblescope.collector.recorder import Recorder, StepRecord
from tests.support import free_port

STEPS = 3
MICROBATCHES = 4
IMPLEMENTATIONS = [
    pytest.param(None, id="python"),
    pytest.param(
        native.hotpath,
        id="c",
        marks=pytest.mark.skipif(native.hotpath is None, reason="the C hot path is not built here"),
    ),
]


def _rank_main(rank: int, world: int, port: int, schedule_name: str, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleZBVZeroBubble

    from bubblescope.collector import native as job_native, pipelining as job_pipelining

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        records: list[StepRecord] = []
        recorder = Recorder(records.append, lambda _n: None, 10_000)
        torch.manual_seed(0)
        if schedule_name == "1f1b":
            stage = PipelineStage(nn.Linear(16, 16), rank, world, torch.device("cpu"))
            schedule: Any = Schedule1F1B(stage, n_microbatches=MICROBATCHES, loss_fn=nn.functional.mse_loss)
            first, last = rank == 0, rank == world - 1
        else:  # V: rank 0 holds stages 0 and 3, rank 1 stages 1 and 2
            indices = (rank, 2 * world - 1 - rank)
            stages = [PipelineStage(nn.Linear(16, 16), index, 2 * world, torch.device("cpu")) for index in indices]
            schedule = ScheduleZBVZeroBubble(stages, n_microbatches=MICROBATCHES, loss_fn=nn.functional.mse_loss)
            first = last = rank == 0
        job_pipelining.instrument_schedule(schedule, recorder)
        generator = torch.Generator().manual_seed(1)
        for _ in range(STEPS):
            inputs, targets = torch.randn(8, 16, generator=generator), torch.randn(8, 16, generator=generator)
            with recorder.step():
                if first and last:
                    schedule.step(inputs, target=targets)
                elif first:
                    schedule.step(inputs)
                else:
                    schedule.step(target=targets)
        job_pipelining.detach()
        document = {
            "native": job_native.hotpath is not None,
            # every field but the step's times; a blocked send's continuation (0 bytes) comes and
            # goes with the timing, so it is left out
            "rows": [
                [list(row[:2]) + list(row[4:]) for row in record.spans if not (row[1] == "send" and row[7] == 0)]
                for record in records
            ],
        }
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(document))
    finally:
        dist.destroy_process_group()


def run_job(tmp_path: Path, schedule_name: str, pure_python: bool) -> dict[int, dict[str, Any]]:
    """The job's processes read BUBBLESCOPE_PURE_PYTHON when they first instrument a schedule."""
    out = tmp_path / f"{schedule_name}-{'python' if pure_python else 'c'}"
    out.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        if pure_python:
            patch.setenv("BUBBLESCOPE_PURE_PYTHON", "1")
        else:
            patch.delenv("BUBBLESCOPE_PURE_PYTHON", raising=False)
        mp.spawn(_rank_main, args=(2, free_port(), schedule_name, str(out)), nprocs=2, join=True)
    return {rank: json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)}


@pytest.mark.slow
@pytest.mark.skipif(native.hotpath is None, reason="the C hot path is not built here")
@pytest.mark.parametrize("schedule_name", ["1f1b", "zbv"])
def test_c_and_python_wrappers_record_the_same_rows_in_a_real_job(tmp_path: Path, schedule_name: str) -> None:
    c_job = run_job(tmp_path, schedule_name, pure_python=False)
    python_job = run_job(tmp_path, schedule_name, pure_python=True)
    for rank in range(2):
        assert c_job[rank]["native"] and not python_job[rank]["native"]
        c_rows, python_rows = c_job[rank]["rows"], python_job[rank]["rows"]
        kinds = {row[1] for step in c_rows for row in step}
        expected = (
            {"forward", "backward", "send", "recv"}
            if schedule_name == "1f1b"
            else {"forward", "backward_input", "backward_weight", "send", "recv"}
        )
        assert expected <= kinds, (rank, kinds)
        assert c_rows == python_rows, rank


# ---- in-process: both implementations, case by case ------------------------------------------


def new_recorder(capacity: int = 100) -> tuple[Recorder, list[int]]:
    dropped: list[int] = []
    return Recorder(lambda _record: None, dropped.append, capacity), dropped


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_a_compute_span_is_recorded_even_when_the_chunk_raises_and_the_error_passes_through(
    implementation: ModuleType | None,
) -> None:
    recorder, _ = new_recorder()

    def failing_chunk(chunk_id: int, full_backward: bool = True) -> None:
        raise ValueError(f"chunk {chunk_id} failed")

    backward = pipelining._timed(failing_chunk, recorder, 2, "backward", native=implementation)
    with pytest.raises(ValueError, match="chunk 5 failed"):
        backward(5, full_backward=False)
    with pytest.raises(ValueError, match="chunk 6 failed"):
        backward(6)
    with pytest.raises(ValueError, match="chunk 7 failed"):
        backward(chunk_id=7, full_backward=0)
    assert [row[:2] + row[4:] for row in recorder.spans] == [
        (0, "backward_input", 2, 5, None, None, None, None),
        (0, "backward", 2, 6, None, None, None, None),
        (0, "backward_input", 2, 7, None, None, None, None),
    ]
    assert all(row[2] <= row[3] for row in recorder.spans)
    assert backward.__wrapped__ is failing_chunk and backward.__name__ == "failing_chunk"


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_a_full_buffer_drops_and_counts_and_a_paused_recorder_records_nothing(
    implementation: ModuleType | None,
) -> None:
    recorder, dropped = new_recorder(capacity=2)
    forward = pipelining._timed(lambda chunk_id: chunk_id * 10, recorder, 0, "forward", native=implementation)
    assert [forward(i) for i in range(3)] == [0, 10, 20]
    assert [row[5] for row in recorder.spans] == [0, 1] and dropped == [1]
    with recorder.paused():
        assert forward(7) == 70
    assert len(recorder.spans) == 2 and dropped == [1]


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_the_loss_stretches_only_the_last_stages_forward_of_its_micro_batch(implementation: ModuleType | None) -> None:
    class Stage:
        def __init__(self, is_last: bool) -> None:
            self.is_last = is_last

    recorder, _ = new_recorder()
    recorder.add("forward", 10, 20, 1, 0)
    recorder.add("forward", 30, 40, 1, 1)
    recorder.add("backward", 50, 60, 1, 0)

    def compute_loss(stage: Stage, output: Any, target_mbs: Any, mb_index: int, *args: Any) -> str:
        if output == "bad":
            raise RuntimeError("loss failed")
        return f"loss {mb_index}"

    loss = pipelining._loss_wrapper(compute_loss, recorder, implementation)
    assert loss(Stage(is_last=True), "out", None, 0) == "loss 0"
    assert loss(Stage(is_last=False), "out", None, 1) == "loss 1"
    ends = [row[3] for row in recorder.spans]
    assert ends[0] > 10_000 and ends[1:] == [40, 60]  # stretched to now (a local_ns reading)
    with pytest.raises(RuntimeError, match="loss failed"):
        loss(Stage(is_last=True), "bad", None, 1)
    assert recorder.spans[1][3] > 10_000  # stretched although the loss raised


@pytest.fixture
def one_rank_group() -> Iterator[None]:
    """A world of one (P2POp objects need a default group; nothing is sent)."""
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


class Transport:
    """Stands in for gloo below the wrappers: posting returns works, waiting takes ``wait_s``."""

    def __init__(self) -> None:
        self.wait_s = 0.0
        self.fail_posting = False

    def post(self, p2p_ops: list[Any], desc: str | None = None) -> list[str]:
        if self.fail_posting:
            raise RuntimeError("connection reset")
        return [f"work {i}" for i in range(len(p2p_ops))]

    def wait(self, works: list[str]) -> None:
        time.sleep(self.wait_s)


def p2p_op(kind: Any, peer: int, elements: int, tag: tuple[Any, ...] | None = None) -> Any:
    op = dist.P2POp(kind, torch.zeros(elements), peer)
    if tag is not None:
        op._bubblescope_tag = tag
    return op


def p2p_setup(
    implementation: ModuleType | None, capacity: int = 100
) -> tuple[Recorder, Transport, dict[str, Any], Any, Any]:
    """A recorder, the transport, the pipelining state, and the recording batch and wait over them."""
    recorder, _ = new_recorder(capacity)
    transport = Transport()
    state: dict[str, Any] = {"recorder": recorder, "pending": {}}
    batch, wait = pipelining._p2p_wrappers(transport.post, transport.wait, state, implementation)
    return recorder, transport, state, batch, wait


def post_and_wait_a_1f1b_pair(recorder: Recorder, transport: Transport, batch: Any, wait: Any) -> None:
    """A send and a recv posted together, a wait that blocks, nothing run in between: two spans,
    the send stretched to the wait's end."""
    works = batch([p2p_op(dist.isend, 1, 4, ("fwd", 0, 3)), p2p_op(dist.irecv, 1, 8, ("bwd", 0, 2))])
    transport.wait_s = 0.002
    wait(works)
    send, recv = recorder.spans
    assert send[1:2] + send[4:] == ("send", 0, 3, 1, 16, "pp", "fwd")
    assert recv[1:2] + recv[4:] == ("recv", 0, 2, 1, 32, "pp", "bwd")
    assert send[3] == recv[3] and recv[3] - recv[2] >= 2_000_000


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_p2p_batches_become_send_and_recv_spans_with_blocked_sends_stretched_or_continued(
    one_rank_group: None, implementation: ModuleType | None
) -> None:
    recorder, transport, state, batch, wait = p2p_setup(implementation)
    assert batch.__wrapped__ == transport.post

    # 1F1B's pair: a send and a recv posted together; the wait blocks; nothing ran since
    post_and_wait_a_1f1b_pair(recorder, transport, batch, wait)

    # a send waited on after other work ran: its blocked part is a second send span of 0 bytes
    works = batch([p2p_op(dist.isend, 1, 4, ("bwd", 0, 1))])
    recorder.add("forward", 1, 2, 0, 4)
    wait(works)
    posted, _forward, continued = recorder.spans[2:]
    assert posted[7] == 16 and continued[1:2] + continued[4:] == ("send", 0, 1, 1, 0, "pp", "bwd")
    assert continued[3] - continued[2] >= 2_000_000 and posted[3] < continued[2]

    # several recvs of one micro-batch from one peer are one wait: one span, bytes summed; a quick
    # wait leaves its send as posted
    transport.wait_s = 0.0
    untagged_send = p2p_op(dist.isend, 1, 2)
    works = batch([p2p_op(dist.irecv, 1, 4, ("fwd", 0, 5)), p2p_op(dist.irecv, 1, 6, ("fwd", 0, 5)), untagged_send])
    wait(works)
    send, recv = recorder.spans[5:]
    assert send[1:2] + send[4:] == ("send", None, None, 1, 8, "pp", None)
    assert recv[1:2] + recv[4:] == ("recv", 0, 5, 1, 40, "pp", "fwd")
    assert state["pending"] == {} and recorder.quiet_depth == 0


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_p2p_wrappers_pass_errors_through_and_record_nothing_while_paused(
    one_rank_group: None, implementation: ModuleType | None
) -> None:
    recorder, transport, state, batch, wait = p2p_setup(implementation)
    transport.fail_posting = True
    with pytest.raises(RuntimeError, match="connection reset"):
        batch([p2p_op(dist.irecv, 1, 4)])
    assert recorder.quiet_depth == 0 and state["pending"] == {} and recorder.spans == []
    transport.fail_posting = False
    with recorder.paused():
        wait(batch([p2p_op(dist.isend, 1, 4), p2p_op(dist.irecv, 1, 4)]))
    state["recorder"] = None
    wait(batch([p2p_op(dist.irecv, 1, 4)]))
    assert recorder.spans == [] and state["pending"] == {}


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_the_gpu_p2p_wrappers_leave_ops_on_cpu_tensors_to_the_host_wrappers(
    one_rank_group: None, implementation: ModuleType | None
) -> None:
    """A job timing its GPU that also sends CPU tensors: those ops record exactly as on the host,
    through the host wrappers under the GPU ones, and no CUDA call is made for them."""
    from bubblescope.collector.gpu_timing import CudaStepClock
    from bubblescope.collector.pipelining_gpu import gpu_p2p_wrappers

    recorder, transport, state, host_batch, host_wait = p2p_setup(implementation)
    state["gpu_pending"] = {}
    batch, wait = gpu_p2p_wrappers(host_batch, host_wait, state)
    assert batch.__wrapped__ == transport.post and wait.__wrapped__ == transport.wait
    recorder.gpu = CudaStepClock()
    recorder.gpu.mark = lambda: pytest.fail("a CUDA event for an op on CPU tensors")

    post_and_wait_a_1f1b_pair(recorder, transport, batch, wait)
    assert state["pending"] == {} and state["gpu_pending"] == {} and recorder.quiet_depth == 0


def test_the_c_hot_path_is_built_and_used_wherever_a_c_compiler_is() -> None:
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}) here: the collector runs on its Python wrappers")
    if os.environ.get("BUBBLESCOPE_PURE_PYTHON"):
        pytest.skip("BUBBLESCOPE_PURE_PYTHON is set in this environment")
    assert native.hotpath is not None, "collector/_hotpath.c was not built: reinstall with `pip install -e .`"
    probe = "from bubblescope.collector import native; print(native.hotpath is None)"
    forced = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "BUBBLESCOPE_PURE_PYTHON": "1"},
    )
    assert forced.stdout.strip() == "True"


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_the_wrappers_keep_no_references_and_no_memory_over_many_steps(
    one_rank_group: None, implementation: ModuleType | None
) -> None:
    """A leaked reference per call would show in the refcounts of what every call touches, and a
    leaked object per call in tracemalloc's figure (every Python object is allocated through it)."""
    import gc
    import tracemalloc

    class Stage:
        is_last = True

    recorder, _transport, state, batch, wait = p2p_setup(implementation, capacity=1000)

    def chunk(chunk_id: int, full_backward: bool = True) -> int:
        return chunk_id

    def compute_loss(stage: Any, output: Any, target_mbs: Any, mb_index: int) -> None:
        return None

    forward = pipelining._timed(chunk, recorder, 0, "forward", native=implementation)
    backward = pipelining._timed(chunk, recorder, 0, "backward", native=implementation)
    loss = pipelining._loss_wrapper(compute_loss, recorder, implementation)
    stage = Stage()
    ops = [p2p_op(dist.isend, 1, 4, ("fwd", 0, 1)), p2p_op(dist.irecv, 1, 4, ("bwd", 0, 1))]
    watched = [recorder, state, state["pending"], chunk, compute_loss, stage, *ops, *(op.tensor for op in ops)]

    def steps(count: int) -> None:
        for step in range(count):
            forward(step % 8)
            loss(stage, None, None, step % 8)
            backward(step % 8, full_backward=step % 2 == 0)
            wait(batch(ops))
            works = batch(ops[:1])
            recorder.add("optimizer", 1, 2)
            wait(works)  # a continued send (other work since posting) every other step
            if step % 10 == 9:
                recorder.end_step()  # the buffer handed over and dropped, as the shipper would

    steps(200)
    gc.collect()
    references = [sys.getrefcount(item) for item in watched]
    tracemalloc.start()
    try:
        steps(200)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        steps(5000)
        recorder.end_step()
        gc.collect()
        growth = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert [sys.getrefcount(item) for item in watched] == references
    assert growth < 16_384, f"{growth} bytes more after 5,000 steps"
