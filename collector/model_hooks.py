"""Compute spans of any model, from module and autograd hooks: ``collector.instrument_model``.

- **forward**: a forward pre-hook and a forward hook on the module (prepended, so that they run before
  other hooks, FSDP2's included). A forward run again inside a backward (activation checkpointing's
  recompute) is part of that backward and is not recorded twice.
- **backward**: from the moment the gradient of the module's output is computed (a hook on that tensor,
  registered by the forward hook) to the end of the gradient computation: a callback queued on the
  autograd engine from that hook, which runs after the whole graph, and before the callbacks DDP and
  FSDP2 queue later in the same backward to wait for their last gradient reductions, so those waits are
  communication, not compute.
- **Waits are not compute**: where the training thread blocked in a communication op inside the span
  (an FSDP2 all-gather it needed, a gradient reduction it waited for: ``Recorder.blocked``), the span is
  cut around the wait; the op's own span covers it.
- On CUDA (``Recorder.gpu``) the span's ends are CUDA events on the current stream, as the pipelining
  integration's actions are.

A run whose compute a pipelining schedule already records (``Recorder.pipeline_compute``) records
nothing here. Every hook is guarded: a failure drops the span, never the training step.
"""

from __future__ import annotations

from typing import Any

from bubblescope.collector.clock import local_ns
from bubblescope.collector.recorder import Recorder


def _in_backward() -> bool:
    import torch

    return bool(torch._C._current_graph_task_id() != -1)


def _first_grad_tensor(value: Any) -> Any:
    """The first tensor requiring grad in a module's output (a tensor, a sequence, a mapping, a dataclass-like
    object with tensors as attributes is not searched); None when there is none."""
    import torch

    if isinstance(value, torch.Tensor):
        return value if value.requires_grad else None
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    for item in items:
        found = _first_grad_tensor(item)
        if found is not None:
            return found
    return None


class ModelTimer:
    """The hooks of one instrumented module; ``name`` labels its spans."""

    def __init__(self, recorder: Recorder, name: str) -> None:
        self.recorder = recorder
        self.name = name
        self._forward: tuple[int, Any, int] | None = None  # (host start, start event, blocked waits so far)

    def _skip(self) -> bool:
        recorder = self.recorder
        return bool(recorder.paused_depth or recorder.pipeline_compute)

    def before_forward(self, _module: Any, _args: Any) -> None:
        try:
            if self._skip() or _in_backward():
                self._forward = None
                return
            recorder = self.recorder
            start = local_ns()
            self._forward = (start, self._mark(), len(recorder.blocked))
        except Exception:  # noqa: BLE001 - never into the training step
            self._forward = None

    def after_forward(self, _module: Any, _args: Any, output: Any) -> None:
        try:
            opened, self._forward = self._forward, None
            if opened is None:
                return
            self._record("forward", *opened)
            import torch

            if torch.is_grad_enabled():
                tensor = _first_grad_tensor(output)
                if tensor is not None:
                    tensor.register_hook(self._backward_started)
        except Exception:  # noqa: BLE001
            pass

    def _backward_started(self, _grad: Any) -> None:
        try:
            if self._skip():
                return
            from torch.autograd import Variable

            opened = (local_ns(), self._mark(), len(self.recorder.blocked))
            Variable._execution_engine.queue_callback(lambda: self._backward_ended(opened))
        except Exception:  # noqa: BLE001
            pass

    def _backward_ended(self, opened: tuple[int, Any, int]) -> None:
        try:
            self._record("backward", *opened)
        except Exception:  # noqa: BLE001
            pass

    def _mark(self) -> Any:
        clock = self.recorder.gpu
        return None if clock is None else clock.mark()

    def _record(self, kind: str, start: int, start_event: Any, blocked_from: int) -> None:
        recorder = self.recorder
        clock = recorder.gpu
        if start_event is not None and clock is not None:
            recorder.add_gpu(
                kind, start_event, clock.mark(), None, None, None, None, None, self.name, host_start_ns=start
            )
            return
        end = local_ns()
        for wait_start, wait_end in recorder.blocked[blocked_from:]:
            if wait_start >= end:
                break
            if wait_end <= start:
                continue
            if wait_start > start:
                recorder.add(kind, start, wait_start, None, None, None, None, None, self.name)
            start = max(start, wait_end)
        if end > start:
            recorder.add(kind, start, end, None, None, None, None, None, self.name)


def instrument_model(module: Any, recorder: Recorder, name: str | None = None) -> ModelTimer:
    """Record ``module``'s every forward and backward as compute spans named ``name`` (default: its class)."""
    timer = ModelTimer(recorder, name or type(module).__name__)
    module.register_forward_pre_hook(timer.before_forward, prepend=True)
    module.register_forward_hook(timer.after_forward, prepend=True)
    return timer
