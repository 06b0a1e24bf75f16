"""Spans for every collective and point-to-point call of ``torch.distributed``.

``install`` wraps, once per process, the public functions of ``torch.distributed``
(all_reduce, all_gather, all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor,
all_to_all, all_to_all_single, broadcast, send, recv, isend, irecv, batch_isend_irecv) and the
functional collectives DTensor and tensor parallelism use (``_functional_collectives``'s
all_reduce, all_gather_single, reduce_scatter_single, all_to_all_single, broadcast). Each
call becomes one span with its bytes, peer (point-to-point and broadcast source) and group label.

When a span ends:
- a blocking call: when it returns;
- ``async_op=True``: when its ``Work`` completes. Collectives report completion through their
  future (the time is stamped by the completing thread); gloo's send/recv works have no
  future, so theirs is when ``Work.wait`` returns. The span is written at that wait, on the
  training thread, so it lands in the step that waited;
- a functional collective: when ``wait_tensor`` on its result returns (first use, in eager).

On CUDA tensors, when the job times its GPU (``Recorder.gpu``), both ends are CUDA events
instead (``gpu_timing``): the start on the current stream as the op is issued, the end when the
op ends on the communication stream (NCCL's future), else on the current stream after the wait.

Calls made inside a ``collector.span`` of a communication kind, inside the pipelining
integration (which records its own P2P spans with micro-batch ids), or while torch.compile is
tracing are not recorded twice. Group labels come from ``register_group`` (``collector.
register_mesh`` names each mesh dimension's group after the dimension); otherwise "world" for
the default group, or the group's own description without torch's ``mesh_`` prefix.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any, ClassVar

from bubblescope import wire
from bubblescope.collector.clock import local_ns
from bubblescope.collector.gpu_timing import first_tensor, issue_event
from bubblescope.collector.recorder import Recorder

GpuEnds = tuple[Any, Any] | None  # a GPU-timed op's start event and, when already known, its end event
_MAX_PENDING = 4096  # unwaited async ops are forgotten beyond this, never accumulated
# name -> (span kind, position of the ``group`` argument)
_DIST_OPS: dict[str, tuple[str, int]] = {
    "all_reduce": ("all_reduce", 2),
    "all_gather": ("all_gather", 2),
    "all_gather_into_tensor": ("all_gather", 2),
    "all_gather_single": ("all_gather", 2),
    "reduce_scatter": ("reduce_scatter", 3),
    "reduce_scatter_tensor": ("reduce_scatter", 3),
    "reduce_scatter_single": ("reduce_scatter", 3),
    "all_to_all": ("all_to_all", 2),
    "all_to_all_single": ("all_to_all", 4),
    "broadcast": ("broadcast", 2),
    "send": ("send", 2),
    "recv": ("recv", 2),
    "isend": ("send", 2),
    "irecv": ("recv", 2),
}
# functional collective -> (span kind, position of ``group`` after the input tensor)
_FUNCTIONAL_OPS: dict[str, tuple[str, int]] = {
    "all_reduce": ("all_reduce", 1),
    "all_gather_single": ("all_gather", 1),
    "reduce_scatter_single": ("reduce_scatter", 2),
    "all_to_all_single": ("all_to_all", 2),
    "broadcast": ("broadcast", 1),
}


class _State:
    recorder: Recorder | None = None
    installed = False
    is_compiling: Callable[[], bool] = staticmethod(lambda: False)  # torch.compiler's, once installed
    functional_call: tuple[Any, ...] | None = None  # set between a functional op and its result
    labels: ClassVar[dict[int, str]] = {}
    # id(work or tensor) -> (weak reference, span rows without end (several for a coalesced
    #                        batch), [completion ns or None], CUDA events (start, end or None) or None)
    pending: ClassVar[dict[int, tuple[Any, list[tuple[Any, ...]], list[int | None], GpuEnds]]] = {}


def register_group(group: Any, label: str) -> None:
    """Label spans of ``group`` (a ProcessGroup) with ``label`` (e.g. "dp", "tp", "pp")."""
    _State.labels[id(group)] = label


def _active() -> Recorder | None:
    """The recorder, unless nothing records (paused) or another layer records this call itself."""
    recorder = _State.recorder
    if recorder is None or recorder.quiet_depth or recorder.paused_depth or _State.is_compiling():
        return None
    return recorder


def group_label(group: Any) -> str:
    import torch.distributed as dist

    if group is None or group is dist.GroupMember.WORLD:
        return _State.labels.get(id(dist.GroupMember.WORLD), wire.WORLD_GROUP)
    if isinstance(group, str):  # a functional collective's group name
        name: str = group
        try:
            c10d: Any = dist.distributed_c10d  # _resolve_process_group is private: not in torch's stubs
            group = c10d._resolve_process_group(name)
        except Exception:  # noqa: BLE001
            return name[:32]
    label = _State.labels.get(id(group))
    if label is None:
        description = str(getattr(group, "group_desc", "") or "group")
        label = wire.WORLD_GROUP if description == "default_pg" else description.removeprefix("mesh_")
    return label[:32]


def tensor_bytes(value: Any) -> int:
    """Bytes of a tensor or of a list of tensors (0 for anything else)."""
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(item) for item in value)
    try:
        return int(value.numel() * value.element_size())
    except Exception:  # noqa: BLE001
        return 0


def _peer(name: str, args: tuple[Any, ...], kwargs: dict[str, Any], group: Any) -> int | None:
    """Global rank of the other side of a point-to-point call, or a broadcast's source."""
    import torch.distributed as dist

    key = {"send": "dst", "isend": "dst", "recv": "src", "irecv": "src", "broadcast": "src"}.get(name)
    if key is None:
        return None
    peer = kwargs.get(key, args[1] if len(args) > 1 else None)
    group_peer = kwargs.get(f"group_{key}")
    try:
        if peer is None and group_peer is not None:
            return int(dist.get_global_rank(group, group_peer))
        return None if peer is None else int(peer)
    except Exception:  # noqa: BLE001
        return None


def _payload(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The buffer whose size is reported: the full (unsharded) side of the operation."""
    if name.startswith("all_gather"):
        return args[0] if args else kwargs.get("output_tensor", kwargs.get("tensor_list", kwargs.get("output")))
    if name.startswith(("reduce_scatter", "all_to_all")):
        if len(args) > 1:
            return args[1]
        return kwargs.get("input", kwargs.get("input_list", kwargs.get("input_tensor_list")))
    return args[0] if args else kwargs.get("tensor")


def _key(handle: Any) -> int:
    """A Work by identity; a functional collective's tensor by its storage, because autograd
    may hand ``wait_tensor`` another tensor object aliasing the same result."""
    storage = getattr(handle, "untyped_storage", None)
    if storage is not None:
        try:
            return -int(storage().data_ptr()) - 1
        except Exception:  # noqa: BLE001
            pass
    return id(handle)


def _remember(handle: Any, rows: list[tuple[Any, ...]], completed: list[int | None], gpu: GpuEnds = None) -> None:
    if len(_State.pending) >= _MAX_PENDING:
        _State.pending.clear()
    reference: Callable[[], Any]
    try:
        reference = weakref.ref(handle)
    except TypeError:
        reference = lambda: handle  # noqa: E731 - objects without weak references (rare)
    _State.pending[_key(handle)] = (reference, rows, completed, gpu)


def _finish(handle: Any) -> None:
    key = _key(handle)
    entry = _State.pending.pop(key, None)
    recorder = _State.recorder
    if entry is None or recorder is None:
        return
    if key >= 0 and entry[0]() is not handle:  # an id reused by a new Work: not ours
        return
    _reference, rows, completed, gpu = entry
    clock = recorder.gpu
    events = None
    if gpu is not None and clock is not None:
        start_event, end_event = gpu
        events = (start_event, end_event if end_event is not None else clock.mark())  # the wait made this stream wait
    end = completed[0] if completed[0] is not None else local_ns()
    for kind, start, peer, size, label, name in rows:
        if events is not None:
            recorder.add_gpu(kind, *events, None, None, peer, size, label, name, host_start_ns=start)
        else:
            recorder.add(kind, start, max(start, end), None, None, peer, size, label, name)


def _note_waiting(handle: Any) -> Recorder | None:
    """Tell the watchdog which recorded op a wait blocks in; the recorder to clear after, or None."""
    recorder = _State.recorder
    entry = _State.pending.get(_key(handle))
    if recorder is None or entry is None or recorder.waiting is not None:
        return None
    kind, _start, peer, size, label, name = entry[1][0]
    recorder.waiting = (kind, name, label, peer, size, local_ns())
    return recorder


def _wrap_dist(name: str, kind: str, group_at: int, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def collective(*args: Any, **kwargs: Any) -> Any:
        # ``_active()`` spelled out: the pipelining integration's P2P ops pass through here
        # (quiet) tens of times a step, and a Python call costs microseconds there.
        recorder = _State.recorder
        if recorder is None or recorder.quiet_depth or recorder.paused_depth or _State.is_compiling():
            return original(*args, **kwargs)
        payload = _payload(name, args, kwargs)
        clock = recorder.gpu
        start = local_ns()  # before the start event: the GPU placement's bound
        gpu_start = issue_event(clock, payload)
        row: tuple[Any, ...]
        try:
            group = kwargs.get("group", args[group_at] if len(args) > group_at else None)
            row = (kind, start, _peer(name, args, kwargs, group), tensor_bytes(payload), group_label(group), name)
        except Exception:  # noqa: BLE001 - never break the job's collective
            row = (kind, start, None, None, None, name)
        recorder.waiting = (kind, name, row[4], row[2], row[3], start)  # an async call returns at once
        try:
            with recorder.quiet():  # torch composes some calls of others (send is isend + wait)
                result = original(*args, **kwargs)
        finally:
            recorder.stop_waiting()
        try:
            if gpu_start is not None:
                if result is None or name in ("send", "recv"):  # waited inside: this stream waits for it
                    recorder.add_gpu(kind, gpu_start, clock.mark(), None, None, *row[2:], host_start_ns=start)
                else:
                    _remember(result, [row], [None], (gpu_start, clock.mark_done(result)))
            elif result is None or name in ("send", "recv"):
                recorder.add(kind, start, local_ns(), None, None, *row[2:])
            else:
                completed: list[int | None] = [None]
                _watch_completion(result, completed)
                _remember(result, [row], completed)
        except Exception:  # noqa: BLE001 - never break the job's collective
            pass
        return result

    return collective


def _watch_completion(work: Any, completed: list[int | None]) -> None:
    try:
        future = work.get_future()
    except Exception:  # noqa: BLE001 - gloo send/recv: completion is the wait
        return

    def stamp(_done: Any) -> None:
        completed[0] = local_ns()

    future.add_done_callback(stamp)


def _wrap_batch(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def batch_isend_irecv(p2p_op_list: list[Any]) -> Any:
        recorder = _active()
        if recorder is None:
            return original(p2p_op_list)
        clock = recorder.gpu
        start = local_ns()  # before the start event: the GPU placement's bound
        gpu_start = issue_event(clock, first_tensor(p2p_op_list))
        with recorder.quiet():
            works = original(p2p_op_list)
        try:
            rows = [
                (
                    "send" if getattr(op.op, "__name__", "") == "isend" else "recv",
                    start,
                    int(op.peer),
                    tensor_bytes(op.tensor),
                    group_label(op.group),
                    "batch_isend_irecv",
                )
                for op in p2p_op_list
            ]
            handles = list(works or [])
            if len(handles) == len(rows):
                for row, work in zip(rows, handles):
                    gpu = None if gpu_start is None else (gpu_start, clock.mark_done(work))
                    _remember(work, [row], [None], gpu)
            elif handles:  # one coalesced Work for all the ops (NCCL): they end at its wait
                _remember(handles[-1], rows, [None], None if gpu_start is None else (gpu_start, None))
        except Exception:  # noqa: BLE001
            pass
        return works

    return batch_isend_irecv


def _wrap_work_wait(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _State.pending:
            return original(self, *args, **kwargs)
        waiting = _note_waiting(self)
        try:
            result = original(self, *args, **kwargs)
        finally:
            if waiting is not None:
                waiting.stop_waiting()
        _finish(self)
        return result

    return wait


def _wrap_functional(name: str, kind: str, group_at: int, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def functional(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        recorder = _active()
        if recorder is None:
            return original(tensor, *args, **kwargs)
        start = local_ns()  # before the start event: the GPU placement's bound
        gpu_start = issue_event(recorder.gpu, tensor)
        group = kwargs.get("group", args[group_at] if len(args) > group_at else None)
        _State.functional_call = (kind, start, None, tensor_bytes(tensor), group, name, gpu_start)
        try:
            return original(tensor, *args, **kwargs)
        finally:
            _State.functional_call = None

    return functional


def _wrap_maybe_wrap_tensor(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def maybe_wrap_tensor(tensor: Any) -> Any:
        call = _State.functional_call
        if call is not None:
            _State.functional_call = None
            try:
                kind, start, peer, size, group, name, gpu_start = call
                label = group_label(_group_of(group))
                if kind == "all_gather":
                    size = tensor_bytes(tensor)
                gpu = None if gpu_start is None else (gpu_start, None)  # its end: after wait_tensor
                _remember(tensor, [(kind, start, peer, size, label, name)], [None], gpu)
            except Exception:  # noqa: BLE001
                pass
        return original(tensor)

    return maybe_wrap_tensor


def _group_of(group: Any) -> Any:
    """A ProcessGroup (or its name) from a functional collective's group argument (a mesh too)."""
    try:
        from torch.distributed import _functional_collectives as funcol

        return funcol._resolve_group(group)
    except Exception:  # noqa: BLE001
        return group


def _wrap_wait_tensor(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wait_tensor(tensor: Any) -> Any:
        if not _State.pending:
            return original(tensor)
        waiting = _note_waiting(tensor)
        try:
            result = original(tensor)
        finally:
            if waiting is not None:
                waiting.stop_waiting()
        _finish(tensor)
        return result

    return wait_tensor


def install(recorder: Recorder) -> None:
    """Record every collective of this process into ``recorder`` (wraps once; later calls re-point)."""
    _State.recorder = recorder
    if _State.installed:
        return
    import torch
    import torch.distributed as dist
    from torch.distributed import _functional_collectives as funcol, distributed_c10d as c10d

    for name, (kind, group_at) in _DIST_OPS.items():
        if not hasattr(c10d, name):  # newer than this torch (all_gather_single: after 2.11)
            continue
        wrapped = _wrap_dist(name, kind, group_at, getattr(c10d, name))
        setattr(c10d, name, wrapped)
        setattr(dist, name, wrapped)
    batch = _wrap_batch(c10d.batch_isend_irecv)
    c10d.batch_isend_irecv = batch
    dist.batch_isend_irecv = batch
    work: Any = dist.Work  # a C++ class: its method is replaced, which mypy does not allow on a typed one
    work.wait = _wrap_work_wait(work.wait)
    for name, (kind, group_at) in _FUNCTIONAL_OPS.items():
        if hasattr(funcol, name):
            setattr(funcol, name, _wrap_functional(name, kind, group_at, getattr(funcol, name)))
    funcol._maybe_wrap_tensor = _wrap_maybe_wrap_tensor(funcol._maybe_wrap_tensor)
    funcol.wait_tensor = _wrap_wait_tensor(funcol.wait_tensor)
    _State.is_compiling = staticmethod(torch.compiler.is_compiling)
    _State.installed = True


def detach() -> None:
    """Stop recording; the wrappers stay in place as pass-throughs."""
    _State.recorder = None
    _State.pending.clear()
