"""Integration with ``torch.distributed.pipelining`` schedules (every schedule torch ships).

torch offers no hooks for pipeline actions, so ``instrument`` wraps, on the given schedule
only, each of its stages' ``forward_one_chunk`` / ``backward_one_chunk`` /
``backward_weight_one_chunk`` (compute spans carrying the stage's own index, i.e. the virtual
stage id, and the micro-batch; a zero-bubble schedule's input-gradient and weight-gradient parts
become ``backward_input`` and ``backward_weight`` spans) and ``get_{fwd,bwd}_{send,recv}_ops``
(which tag each P2P op with its stage, micro-batch and direction). Every schedule posts and
waits P2P ops through the module functions ``_batch_p2p`` and ``_wait_batch_p2p``; those are
wrapped once per process.

The tagging wrappers are in place only during steps recorded in full detail (the recorder's
detail listener swaps them in and out): other steps travel as aggregates, which need a P2P
span's kind and times but not its micro-batch, so there an op's spans are recorded untagged
(stage, micro-batch and direction unset) and the getters cost the step nothing.

A tagged recv becomes a ``recv`` span covering the wait on it. A tagged send becomes a ``send``
span from its posting; gloo cannot report when a send completes (no future, ``is_completed``
stays false until waited), so its end is decided at its wait:

- the wait did not block: the send cost this rank only its posting, the span ends there;
- it blocked and nothing else ran since the posting (1F1B's send+recv pairs): the span is
  stretched to the wait's end, as a send to a busy peer is communication, not idle;
- it blocked after other work ran (the looped schedules wait on sends at the step's end): the
  blocked part becomes a second ``send`` span for the same transfer, with ``bytes`` 0.

The wrappers pass straight through when no recorder is active (none, or paused).

Each stage's layers (``stage_size.layer_groups``) are timed too on some steps (``model_hooks.LayerSteps``), as block spans named
``wire.stage_layer_span_name`` nested in the stage's actions (``BUBBLESCOPE_STAGE_LAYERS``, on by default):
what a layer costs, and by difference what the stage computes outside its layers (embedding, head, loss),
which a rebalance leaves where it is.

The wrappers that run per action (compute, P2P batch and wait, loss) are C callables from
``_hotpath`` when it was built (``native.active()``, chosen when the first schedule is
instrumented); the Python ones below are their reference and the fallback, and record the same rows.
"""

from __future__ import annotations

import functools
import logging
import weakref
from types import ModuleType
from typing import Any

from bubblescope import wire
from bubblescope.collector.clock import local_ns
from bubblescope.collector.native import active as active_hotpath
from bubblescope.collector.recorder import GpuSpanTimer, Recorder
from bubblescope.collector.stage_size import stage_sizes

log = logging.getLogger("bubblescope.collector")
_TAG = "_bubblescope_tag"
_BLOCKED_NS = 30_000  # a wait on an already finished op returns in a few microseconds
_ACTIVE: Any = object()  # ``native`` argument of the wrapper builders: the C module this process chose
_UNTAGGED = (None, None, None)  # (direction, stage, micro-batch) of an op on a step without detail
_GETTERS = "_bubblescope_getters"  # on a stage: [(attribute, tagging wrapper, own attribute or None)]
# "stages": the instrumented stages, weakly (a job may build schedules anew; none is kept alive)
_state: dict[str, Any] = {
    "recorder": None,
    "patched": False,
    "pending": {},
    "stages": weakref.WeakSet(),
    "listening": None,
    "gpu_patched": False,
    "gpu_pending": {},
}


# The wrappers below run for every pipeline action of the job (tens per step), and each Python
# call they make costs microseconds there (cold caches between actions; about 3 us per wrapped
# call measured in the 2-stage demo job, against 0.3 us in a tight loop), so they make
# as few as they can: timestamps from the ``local_ns`` builtin, spans appended straight to the
# recorder's buffer (``Recorder.add`` only when the buffer is full or paused), sizes from the
# ``nbytes`` attribute, no context-manager objects.


def _patch_p2p_once() -> None:
    if _state["patched"]:
        return
    from torch.distributed.pipelining import schedules

    schedules._batch_p2p, schedules._wait_batch_p2p = _p2p_wrappers(
        schedules._batch_p2p, schedules._wait_batch_p2p, _state, active_hotpath()
    )
    _state["patched"] = True


def _patch_gpu_p2p_once() -> None:
    """On top of the host wrappers: CUDA-event P2P spans while the recorder times the GPU."""
    if _state["gpu_patched"]:
        return
    from torch.distributed.pipelining import schedules

    from bubblescope.collector.pipelining_gpu import gpu_p2p_wrappers

    schedules._batch_p2p, schedules._wait_batch_p2p = gpu_p2p_wrappers(
        schedules._batch_p2p, schedules._wait_batch_p2p, _state
    )
    _state["gpu_patched"] = True


def _p2p_wrappers(
    original_batch: Any, original_wait: Any, state: dict[str, Any], native: ModuleType | None
) -> tuple[Any, Any]:
    """The recording ``_batch_p2p`` and ``_wait_batch_p2p`` (C ones when ``native`` is given)."""
    # id(works) -> (works kept alive, recvs (stage, microbatch, peer, name, bytes),
    #               send indices in the buffer, the buffer and its length right after posting)
    pending: dict[int, tuple[Any, list[tuple[Any, ...]], list[int], list[Any], int]] = state["pending"]
    if native is not None:
        batch = native.batch_p2p(original_batch, state, pending)
        wait = native.wait_batch_p2p(original_wait, state, pending, _merge_recvs, _BLOCKED_NS)
        return functools.update_wrapper(batch, original_batch), functools.update_wrapper(wait, original_wait)

    @functools.wraps(original_batch)
    def batch_p2p(p2p_ops: list[Any], desc: str | None = None) -> Any:
        recorder: Recorder | None = state["recorder"]
        if recorder is None or recorder.paused_depth:
            return original_batch(p2p_ops, desc=desc)
        posted = local_ns()
        recorder.quiet_depth += 1  # recorded here, with micro-batch ids, not by the collectives layer
        try:
            works = original_batch(p2p_ops, desc=desc)
        finally:
            recorder.quiet_depth -= 1
        done = local_ns()
        recvs: list[tuple[Any, ...]] = []
        sends: list[int] = []
        spans = recorder.spans
        for op in p2p_ops:
            name, stage, microbatch = getattr(op, _TAG, _UNTAGGED)
            if getattr(op.op, "__name__", "") == "isend":  # never raises in the training loop
                row = (
                    recorder.step_index,
                    "send",
                    posted,
                    done,
                    stage,
                    microbatch,
                    op.peer,
                    getattr(op.tensor, "nbytes", 0),
                    wire.PIPELINE_GROUP,
                    name,
                )
                if len(spans) < recorder.capacity:
                    spans.append(row)
                    sends.append(len(spans) - 1)
                else:
                    recorder.add(*row[1:])
            else:
                recvs.append((stage, microbatch, op.peer, name, getattr(op.tensor, "nbytes", 0)))
        if recvs or sends:
            pending[id(works)] = (works, recvs, sends, spans, len(spans))
        return works

    @functools.wraps(original_wait)
    def wait_batch_p2p(work: Any) -> Any:
        entry = pending.pop(id(work), None)
        recorder: Recorder | None = state["recorder"]
        if recorder is None or entry is None:
            return original_wait(work)
        started = local_ns()
        _works, recvs, sends, posted_spans, posted_length = entry
        recorder.waiting = ("p2p", entry, started)  # decoded by recorder.waiting_op off this thread
        recorder.quiet_depth += 1
        try:
            result = original_wait(work)
        finally:
            recorder.quiet_depth -= 1
            recorder.waiting = None
        finished = local_ns()
        spans = recorder.spans
        quiet_since_post = spans is posted_spans and len(spans) == posted_length
        for stage, microbatch, peer, name, size in recvs if len(recvs) < 2 else _merge_recvs(recvs):
            row = (
                recorder.step_index,
                "recv",
                started,
                finished,
                stage,
                microbatch,
                peer,
                size,
                wire.PIPELINE_GROUP,
                name,
            )
            if len(spans) < recorder.capacity:
                spans.append(row)
            else:
                recorder.add(*row[1:])
        if sends and finished - started > _BLOCKED_NS:
            if quiet_since_post:  # the sends are still the newest spans of this step's buffer
                for index in sends:
                    row = spans[index]
                    spans[index] = row[:3] + (finished,) + row[4:]
            else:
                for index in sends:
                    recorder.repeat_at(index, posted_spans, started, finished)
        return result

    return batch_p2p, wait_batch_p2p


def _merge_recvs(recvs: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """One recv span per (stage, micro-batch, peer, direction): a stage receiving several tensors
    from one peer for one micro-batch waits on them together."""
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


def _timed(method: Any, recorder: Recorder, stage_index: int, kind: str, native: ModuleType | None = _ACTIVE) -> Any:
    """``method`` (a stage's ``*_one_chunk``) timed as a span of ``kind``; a backward that is
    only the input-gradient part (``full_backward=False``) becomes ``backward_input``. ``native``:
    the C module to build it from (None: Python; by default the one this process uses)."""
    split_backward = kind == "backward"
    if native is _ACTIVE:
        native = active_hotpath()
    if native is not None:
        return functools.update_wrapper(native.timed(method, recorder, stage_index, kind, split_backward), method)

    @functools.wraps(method)
    def run_chunk(chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        start = local_ns()
        try:
            return method(chunk_id, *args, **kwargs)
        finally:
            span_kind = "backward_input" if split_backward and not kwargs.get("full_backward", True) else kind
            row = (recorder.step_index, span_kind, start, local_ns(), stage_index, chunk_id, None, None, None, None)
            spans = recorder.spans
            if len(spans) < recorder.capacity:
                spans.append(row)
            else:
                recorder.add(*row[1:])

    return run_chunk


def _gpu_timed(method: Any, recorder: Recorder, stage_index: int, kind: str) -> Any:
    """``_timed`` for a stage on a CUDA device: CUDA events on the stream running the kernels."""
    is_backward = kind == "backward"
    host_timed = _timed(method, recorder, stage_index, kind)  # when GPU timing is off

    @functools.wraps(method)
    def run_chunk(chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        if recorder.gpu is None or recorder.paused_depth:
            return host_timed(chunk_id, *args, **kwargs)
        span_kind = "backward_input" if is_backward and not kwargs.get("full_backward", True) else kind
        with GpuSpanTimer(recorder, span_kind, stage_index, chunk_id):
            return method(chunk_id, *args, **kwargs)

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
        "stage_sizes": stage_sizes([getattr(stage, "submod", None) for stage in stages]),
    }


def instrument_schedule(schedule: Any, recorder: Recorder, time_layers: bool = False) -> None:
    """Record every compute action and P2P wait of ``schedule`` into ``recorder``; with ``time_layers``, each
    stage's layers too (``model_hooks.instrument_stage_layers``)."""
    _patch_p2p_once()
    _state["recorder"] = recorder
    stages = schedule_stages(schedule)
    if any(getattr(getattr(stage, "device", None), "type", "cpu") == "cuda" for stage in stages):
        _patch_gpu_p2p_once()
    for stage in stages:
        if getattr(stage, _TAG, False):
            continue
        index = int(stage.stage_index)
        on_gpu = getattr(getattr(stage, "device", None), "type", "cpu") == "cuda"
        timed = _gpu_timed if on_gpu else _timed
        stage.forward_one_chunk = timed(stage.forward_one_chunk, recorder, index, "forward")
        stage.backward_one_chunk = timed(stage.backward_one_chunk, recorder, index, "backward")
        if hasattr(stage, "backward_weight_one_chunk"):
            stage.backward_weight_one_chunk = timed(stage.backward_weight_one_chunk, recorder, index, "backward_weight")
        # The first stage receives no activations and sends no gradients, the last the reverse:
        # those getters always return no ops, so they are left unwrapped (a call less per action).
        getters = []
        if not getattr(stage, "is_first", False):
            getters += [("get_fwd_recv_ops", wire.P2P_FORWARD), ("get_bwd_send_ops", wire.P2P_BACKWARD)]
        if not getattr(stage, "is_last", False):
            getters += [("get_fwd_send_ops", wire.P2P_FORWARD), ("get_bwd_recv_ops", wire.P2P_BACKWARD)]
        setattr(
            stage,
            _GETTERS,
            [
                # own: an instance attribute set before us, put back on steps without detail
                (attribute, _tagging(getattr(stage, attribute), direction, index), vars(stage).get(attribute))
                for attribute, direction in getters
            ],
        )
        setattr(stage, _TAG, True)
        _state["stages"].add(stage)
        if time_layers:
            _time_layers(stage, index, recorder)
    if _state["listening"] is recorder:
        _use_tagging(recorder.detailed)
    else:
        _state["listening"] = recorder
        recorder.add_detail_listener(_use_tagging)
    if any(getattr(stage, "is_last", False) for stage in stages):
        _extend_forward_by_loss(schedule, recorder)


def _time_layers(stage: Any, index: int, recorder: Recorder) -> None:
    """Per-layer spans of the stage's module; a module the hooks cannot take leaves the stage's spans as they are."""
    module = getattr(stage, "submod", None)
    if module is None:
        return
    try:
        from bubblescope.collector.model_hooks import instrument_stage_layers

        if not instrument_stage_layers(module, index, recorder):
            log.info("bubblescope: stage %d's layers are not timed one by one (none found, or compiled)", index)
    except Exception as error:  # noqa: BLE001 - the stage's own spans do not depend on it
        log.warning("bubblescope: stage %d's layers are not timed: %r", index, error)


def _use_tagging(detailed: bool) -> None:
    """The recorder's detail listener: the tagging getters in place for detailed steps only."""
    for stage in list(_state["stages"]):
        for attribute, wrapper, own in getattr(stage, _GETTERS, ()):
            if detailed:
                setattr(stage, attribute, wrapper)
            elif own is not None:
                setattr(stage, attribute, own)
            else:
                vars(stage).pop(attribute, None)  # the class's method again


def _extend_forward_by_loss(schedule: Any, recorder: Recorder) -> None:
    """The loss is part of the last stage's forward of each micro-batch."""
    schedule._maybe_compute_loss = _loss_wrapper(schedule._maybe_compute_loss, recorder, active_hotpath())


def _loss_wrapper(compute_loss: Any, recorder: Recorder, native: ModuleType | None) -> Any:
    """``_maybe_compute_loss`` stretching the micro-batch's forward span to the loss's end."""
    if native is not None:
        return functools.update_wrapper(native.loss(compute_loss, recorder), compute_loss)

    @functools.wraps(compute_loss)
    def maybe_compute_loss(stage: Any, output: Any, target_mbs: Any, mb_index: int, *args: Any, **kwargs: Any) -> Any:
        try:
            return compute_loss(stage, output, target_mbs, mb_index, *args, **kwargs)
        finally:
            if getattr(stage, "is_last", False):
                recorder.extend_last("forward", mb_index, local_ns())

    return maybe_compute_loss


def detach() -> None:
    """Stop recording (used by shutdown): the P2P wrappers become pass-throughs, and the
    compute wrappers, which hold their recorder, find it paused for good."""
    recorder: Recorder | None = _state["recorder"]
    if recorder is not None:
        recorder.set_paused_depth(recorder.paused_depth + 1)
    _state["recorder"] = None
    _state["listening"] = None
    _state["pending"].clear()
    _state["gpu_pending"].clear()
