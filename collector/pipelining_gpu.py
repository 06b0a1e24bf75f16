"""Pipeline P2P spans timed by CUDA events, for stages on CUDA while the recorder times the GPU.

With NCCL a pipeline's ``Work.wait`` does not block the host: it makes the current stream wait.
Host times would make every recv look instantaneous and its wait look like idle GPU time. So
these wrappers, installed over the host ones (``pipelining._p2p_wrappers``) once a schedule
with a CUDA stage is instrumented, record each op as CUDA events (``gpu_timing``):

- start: an event on the current stream at the posting (the communication stream waits for
  that point before the op can begin), shared by the ops posted together;
- end: the op's own completion on the communication stream (``CudaStepClock.mark_done``), else
  an event on the current stream right after the wait (when the received data was usable).

A recv covering several tensors from one peer for one micro-batch is one span (as on the host),
ending after the wait. Sends and recvs keep their stage, micro-batch and direction tags. Ops on
CPU tensors, and any step without GPU timing, go to the host wrappers unchanged.
"""

from __future__ import annotations

import functools
from typing import Any

from bubblescope import wire
from bubblescope.collector.clock import local_ns
from bubblescope.collector.gpu_timing import CudaStepClock, first_tensor, issue_event
from bubblescope.collector.pipelining import _TAG, _UNTAGGED
from bubblescope.collector.recorder import Recorder

_MAX_PENDING = 1024
# (kind, direction, stage, micro-batch, peer, bytes, end event or None)
GpuOp = tuple[str, Any, Any, Any, Any, int, Any]


def gpu_p2p_wrappers(host_batch: Any, host_wait: Any, state: dict[str, Any]) -> tuple[Any, Any]:
    """``_batch_p2p`` and ``_wait_batch_p2p`` recording CUDA events, over the host wrappers."""
    original_batch = getattr(host_batch, "__wrapped__", host_batch)
    original_wait = getattr(host_wait, "__wrapped__", host_wait)
    # id(works) -> (works kept alive, start event, host start, ops)
    pending: dict[int, tuple[Any, Any, int, list[GpuOp]]] = state["gpu_pending"]

    @functools.wraps(original_batch)
    def batch_p2p(p2p_ops: list[Any], desc: str | None = None) -> Any:
        recorder: Recorder | None = state["recorder"]
        if recorder is None or recorder.paused_depth:
            return host_batch(p2p_ops, desc=desc)
        clock: CudaStepClock = recorder.gpu
        posted_ns = local_ns()
        posted = issue_event(clock, first_tensor(p2p_ops))
        if posted is None:  # no GPU timing, CPU tensors, or no event now (CUDA graph capture)
            return host_batch(p2p_ops, desc=desc)
        recorder.quiet_depth += 1
        try:
            works = original_batch(p2p_ops, desc=desc)
        finally:
            recorder.quiet_depth -= 1
        try:
            ends = [clock.mark_done(w) for w in works] if len(works) == len(p2p_ops) else [None] * len(p2p_ops)
            ops = [_describe(op, end) for op, end in zip(p2p_ops, ends)]
            if len(pending) >= _MAX_PENDING:  # batches never waited on are forgotten, not accumulated
                pending.clear()
            pending[id(works)] = (works, posted, posted_ns, ops)
        except Exception:  # noqa: BLE001 - never into the training loop; these spans are lost
            pass
        return works

    @functools.wraps(original_wait)
    def wait_batch_p2p(work: Any) -> Any:
        entry = pending.pop(id(work), None)
        recorder: Recorder | None = state["recorder"]
        if entry is None or recorder is None or recorder.gpu is None:
            return host_wait(work)
        recorder.quiet_depth += 1
        try:
            result = original_wait(work)
        finally:
            recorder.quiet_depth -= 1
        try:
            _record(recorder, recorder.gpu, entry)
        except Exception:  # noqa: BLE001
            pass
        return result

    return batch_p2p, wait_batch_p2p


def _describe(op: Any, end: Any) -> GpuOp:
    direction, stage, microbatch = getattr(op, _TAG, _UNTAGGED)
    kind = "send" if getattr(op.op, "__name__", "") == "isend" else "recv"
    return (kind, direction, stage, microbatch, op.peer, int(getattr(op.tensor, "nbytes", 0)), end)


def _record(recorder: Recorder, clock: CudaStepClock, entry: tuple[Any, Any, int, list[GpuOp]]) -> None:
    _works, posted, posted_ns, ops = entry
    after_wait: list[Any] = []

    def waited() -> Any:  # one event after the wait, made only when an op needs it
        if not after_wait:
            after_wait.append(clock.mark())
        return after_wait[0]

    recvs: dict[tuple[Any, ...], tuple[int, Any]] = {}
    for kind, direction, stage, microbatch, peer, size, end in ops:
        if kind == "send":
            recorder.add_gpu(
                "send",
                posted,
                end if end is not None else waited(),
                stage,
                microbatch,
                peer,
                size,
                wire.PIPELINE_GROUP,
                direction,
                host_start_ns=posted_ns,
            )
            continue
        key = (stage, microbatch, peer, direction)
        if key in recvs:  # several tensors of one micro-batch: ready once the wait returned
            recvs[key] = (recvs[key][0] + size, None)
        else:
            recvs[key] = (size, end)
    for (stage, microbatch, peer, direction), (size, end) in recvs.items():
        recorder.add_gpu(
            "recv",
            posted,
            end if end is not None else waited(),
            stage,
            microbatch,
            peer,
            size,
            wire.PIPELINE_GROUP,
            direction,
            host_start_ns=posted_ns,
        )
