"""Integration with ``torch.distributed.pipelining`` schedules (every schedule torch ships).

torch offers no hooks for pipeline actions, so ``instrument`` wraps, on the given schedule
only, each of its stages' ``forward_one_chunk`` / ``backward_one_chunk`` /
``backward_weight_one_chunk`` (compute spans carrying the stage's own index, i.e. the virtual
stage id, and the micro-batch; a zero-bubble schedule's input-gradient and weight-gradient parts
become ``backward_input`` and ``backward_weight`` spans) and ``get_{fwd,bwd}_{send,recv}_ops``
(which tag each P2P op with its stage and micro-batch). Every schedule posts and waits P2P ops
through the module functions ``_batch_p2p`` and ``_wait_batch_p2p``; those are wrapped once per
process.

A tagged recv becomes a ``recv`` span covering the wait on it. A tagged send becomes a ``send``
span from its posting; gloo cannot report when a send completes (no future, ``is_completed``
stays false until waited), so its end is decided at its wait:

- the wait did not block: the send cost this rank only its posting, the span ends there;
- it blocked and nothing else ran since the posting (1F1B's send+recv pairs): the span is
  stretched to the wait's end, as a send to a busy peer is communication, not idle;
- it blocked after other work ran (the looped schedules wait on sends at the step's end): the
  blocked part becomes a second ``send`` span for the same transfer, with ``bytes`` 0.

The wrappers pass straight through when no recorder is active or an op is not tagged.
"""

from __future__ import annotations

import functools
from typing import Any

from bubblescope import wire
from bubblescope.collector.clock import now_ns
from bubblescope.collector.collectives import tensor_bytes
from bubblescope.collector.recorder import GpuSpanTimer, Recorder

_TAG = "_bubblescope_tag"
_BLOCKED_NS = 30_000  # a wait on an already finished op returns in a few microseconds
_state: dict[str, Any] = {"recorder": None, "patched": False, "pending": {}}


# The wrappers below run for every pipeline action of the job (tens per step), so they are
# written for speed: no context-manager objects, no keyword arguments, one span tuple per action.


def _patch_p2p_once() -> None:
    if _state["patched"]:
        return
    from torch.distributed.pipelining import schedules

    original_batch = schedules._batch_p2p
    original_wait = schedules._wait_batch_p2p
    # id(works) -> (works kept alive, recvs (stage, microbatch, peer, name, bytes),
    #               sends (step, index), the recorder's span count right after posting)
    pending: dict[int, tuple[Any, list[tuple[Any, ...]], list[tuple[int, int]], int]] = _state["pending"]

    @functools.wraps(original_batch)
    def batch_p2p(p2p_ops: list[Any], desc: str | None = None) -> Any:
        recorder: Recorder | None = _state["recorder"]
        if recorder is None:
            return original_batch(p2p_ops, desc=desc)
        posted = now_ns()
        recorder.quiet_depth += 1  # recorded here, with micro-batch ids, not by the collectives layer
        try:
            works = original_batch(p2p_ops, desc=desc)
        finally:
            recorder.quiet_depth -= 1
        if recorder.paused_depth:
            return works
        done = now_ns()
        recvs: list[tuple[Any, ...]] = []
        sends: list[tuple[int, int]] = []
        for op in p2p_ops:
            tag = getattr(op, _TAG, None)
            if tag is None:
                continue
            name, stage, microbatch = tag
            if getattr(op.op, "__name__", "") == "isend":  # never raises in the training loop
                index = recorder.add("send", posted, done, stage, microbatch, op.peer,
                                     tensor_bytes(op.tensor), "pp", name)
                sends.append((recorder.current_step, index))
            else:
                recvs.append((stage, microbatch, op.peer, name, tensor_bytes(op.tensor)))
        if recvs or sends:
            pending[id(works)] = (works, recvs, sends, recorder.spans_added)
        return works

    @functools.wraps(original_wait)
    def wait_batch_p2p(work: Any) -> Any:
        entry = pending.pop(id(work), None)
        recorder: Recorder | None = _state["recorder"]
        if recorder is None:
            return original_wait(work)
        started = now_ns()
        recorder.quiet_depth += 1
        try:
            result = original_wait(work)
        finally:
            recorder.quiet_depth -= 1
        if entry is not None:
            finished = now_ns()
            _works, recvs, sends, added_at_post = entry
            quiet_since_post = recorder.spans_added == added_at_post
            for stage, microbatch, peer, name, size in _merge_recvs(recvs):
                recorder.add("recv", started, finished, stage, microbatch, peer, size, "pp", name)
            if sends and finished - started > _BLOCKED_NS:
                if quiet_since_post:
                    for step, index in sends:
                        recorder.extend_at(index, step, finished)
                else:
                    for step, index in sends:
                        recorder.repeat_at(index, step, started, finished)
        return result

    schedules._batch_p2p = batch_p2p
    schedules._wait_batch_p2p = wait_batch_p2p
    _state["patched"] = True


def _merge_recvs(recvs: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """One recv span per (stage, micro-batch, peer, direction): a stage receiving several tensors
    from one peer for one micro-batch waits on them together."""
    if len(recvs) < 2:
        return recvs
    sizes: dict[tuple[Any, ...], int] = {}
    for stage, microbatch, peer, name, size in recvs:
        key = (stage, microbatch, peer, name)
        sizes[key] = sizes.get(key, 0) + size
    return [key + (size,) for key, size in sizes.items()]


def _tagging(method: Any, name: str, stage_index: int) -> Any:
    @functools.wraps(method)
    def get_ops(chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        ops = method(chunk_id, *args, **kwargs)
        tag = (name, stage_index, chunk_id)
        try:
            for op in ops:
                op._bubblescope_tag = tag
        except AttributeError:  # an op type without attributes: its spans are not recorded
            pass
        return ops

    return get_ops


def _timed(method: Any, recorder: Recorder, stage_index: int, kind: str, on_gpu: bool = False) -> Any:
    """``method`` (a stage's ``*_one_chunk``) timed as a span of ``kind``; a backward that is
    only the input-gradient part (``full_backward=False``) becomes ``backward_input``."""
    is_backward = kind == "backward"

    @functools.wraps(method)
    def run_chunk(chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        span_kind = "backward_input" if is_backward and not kwargs.get("full_backward", True) else kind
        if on_gpu and recorder.gpu is not None:  # CUDA events on the stream running the kernels
            with GpuSpanTimer(recorder, span_kind, stage_index, chunk_id):
                return method(chunk_id, *args, **kwargs)
        start = now_ns()
        try:
            return method(chunk_id, *args, **kwargs)
        finally:
            recorder.add(span_kind, start, now_ns(), stage_index, chunk_id)

    return run_chunk


def schedule_stages(schedule: Any) -> list[Any]:
    """The pipeline stages this rank runs under the schedule (one, or several when looped)."""
    stages = getattr(schedule, "_stages", None)
    if stages is None:
        stages = [schedule._stage]
    return list(stages)


def describe(schedule: Any) -> dict[str, Any]:
    """Run configuration learned from the schedule: class, stages, virtual stages, micro-batches."""
    stages = schedule_stages(schedule)
    num_stages = int(getattr(schedule, "_num_stages", stages[0].num_stages))
    return {
        "schedule": type(schedule).__name__,
        "num_stages": num_stages,
        "virtual_stages": len(stages),
        "pipeline_ranks": max(1, num_stages // len(stages)),
        "num_microbatches": int(schedule._n_microbatches),
        "stage_indices": [int(stage.stage_index) for stage in stages],
    }


def instrument_schedule(schedule: Any, recorder: Recorder) -> None:
    """Record every compute action and P2P wait of ``schedule`` into ``recorder``."""
    _patch_p2p_once()
    _state["recorder"] = recorder
    for stage in schedule_stages(schedule):
        if getattr(stage, _TAG, False):
            continue
        index = int(stage.stage_index)
        on_gpu = getattr(getattr(stage, "device", None), "type", "cpu") == "cuda"
        stage.forward_one_chunk = _timed(stage.forward_one_chunk, recorder, index, "forward", on_gpu)
        stage.backward_one_chunk = _timed(stage.backward_one_chunk, recorder, index, "backward", on_gpu)
        if hasattr(stage, "backward_weight_one_chunk"):
            stage.backward_weight_one_chunk = _timed(
                stage.backward_weight_one_chunk, recorder, index, "backward_weight", on_gpu
            )
        stage.get_fwd_recv_ops = _tagging(stage.get_fwd_recv_ops, wire.P2P_FORWARD, index)
        stage.get_fwd_send_ops = _tagging(stage.get_fwd_send_ops, wire.P2P_FORWARD, index)
        stage.get_bwd_recv_ops = _tagging(stage.get_bwd_recv_ops, wire.P2P_BACKWARD, index)
        stage.get_bwd_send_ops = _tagging(stage.get_bwd_send_ops, wire.P2P_BACKWARD, index)
        setattr(stage, _TAG, True)
    compute_loss = schedule._maybe_compute_loss

    @functools.wraps(compute_loss)
    def maybe_compute_loss(
        stage: Any, output: Any, target_mbs: Any, mb_index: int, *args: Any, **kwargs: Any
    ) -> Any:
        try:
            return compute_loss(stage, output, target_mbs, mb_index, *args, **kwargs)
        finally:  # the loss is part of the last stage's forward of this micro-batch
            if getattr(stage, "is_last", False):
                recorder.extend_last("forward", mb_index, now_ns())

    schedule._maybe_compute_loss = maybe_compute_loss


def detach() -> None:
    """Stop recording (used by shutdown); wrappers become pass-throughs."""
    _state["recorder"] = None
    _state["pending"].clear()
