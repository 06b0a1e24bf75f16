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

**Blocks** (``blocks=``: the layers the user wants priced one by one) get the same spans, named
``model/block`` (``wire.block_span_name``), nested in the model's: a block's backward starts at the gradient
of its output and ends at the gradient of its input (the first one requiring grad), or where the next block's
backward starts if that comes first (a framework's hooks between the two, FSDP2's unshard of the next block,
delay the input's gradient), or with the whole backward (a block fed by data). Block backwards of one model
never overlap. They add two module hooks and two tensor hooks per block call, and one engine callback per
backward (``_OpenBackward.close_at_end``).

A run whose compute a pipelining schedule already records (``Recorder.pipeline_compute``) records
nothing here, but for the layers of each pipeline stage (``instrument_stage_layers``), timed as blocks on
detailed steps so that a rebalance moves measured time. Every hook is guarded: a failure drops the span, never
the training step.
"""

from __future__ import annotations

import weakref
from typing import Any, Final

import torch  # this module is imported by instrument_model, when the job has torch loaded
from torch.autograd import Variable

from bubblescope import wire
from bubblescope.collector.clock import local_ns
from bubblescope.collector.recorder import Recorder
from bubblescope.collector.stage_size import layer_groups

_Tensor = torch.Tensor
_grad_enabled = torch.is_grad_enabled
_graph_task_id = torch._C._current_graph_task_id  # -1 outside a backward
_queue_callback = Variable._execution_engine.queue_callback
MAX_LEAF_HOOKS: Final = 64
"""Hooks one block keeps on leaf inputs whose backward has not come (micro-batches in flight); past it the oldest go."""


def _first_grad_tensor(value: Any) -> Any:
    """The first tensor requiring grad in a module's output (a tensor, a sequence, a mapping, a dataclass-like
    object with tensors as attributes is not searched); None when there is none."""
    if isinstance(value, _Tensor):
        return value if value.requires_grad else None
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    for item in items:
        found = _first_grad_tensor(item)
        if found is not None:
            return found
    return None


def _on_gradient(tensor: Any, hook: Any) -> Any:
    """Call ``hook`` once ``tensor``'s gradient is computed: a pre-hook on the node that made the tensor (about
    half the cost of ``Tensor.register_hook``'s Python; it runs at the same moment, and goes with the graph), a
    tensor hook on a leaf (which stays until removed: the handle is returned)."""
    grad_fn = tensor.grad_fn
    if grad_fn is None:
        return tensor.register_hook(hook)
    return grad_fn.register_prehook(hook)


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
            recorder = self.recorder
            if self._skip() or _graph_task_id() != -1:
                self._forward = None
                return
            start = local_ns()
            clock = recorder.gpu
            self._forward = (start, None if clock is None else clock.mark(), len(recorder.blocked))
        except Exception:  # noqa: BLE001 - never into the training step
            self._forward = None

    def after_forward(self, _module: Any, _args: Any, output: Any) -> None:
        try:
            opened, self._forward = self._forward, None
            if opened is None:
                return
            self._record("forward", *opened)
            if _grad_enabled():
                tensor = _first_grad_tensor(output)
                if tensor is not None:
                    _on_gradient(tensor, self._backward_started)
        except Exception:  # noqa: BLE001
            pass

    def _backward_started(self, _grad: Any) -> None:
        try:
            if self._skip():
                return
            opened = (local_ns(), self._mark(), len(self.recorder.blocked))
            _queue_callback(lambda: self._backward_ended(opened))
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


class _OpenBackward:
    """The block backward of one model still open: the next block's backward closes it (hooks a framework
    registered between the two, FSDP2's unshard of the next block, may delay the input's gradient), else the end
    of the backward it runs in (one engine callback per backward, queued by the first block that opens)."""

    def __init__(self) -> None:
        self.block: _BlockBackward | None = None
        self.closing_task = -1  # the backward (graph task) whose end is to close the open block

    def close_at_end(self) -> None:
        task = _graph_task_id()
        if task != self.closing_task:
            self.closing_task = task
            _queue_callback(self._close_open)

    def _close_open(self) -> None:
        self.closing_task = -1
        if self.block is not None:
            self.block.ended(None)


class BlockTimer(ModelTimer):
    """The hooks of one block of an instrumented model: its backward ends at its input's gradient, or where the
    next block's backward starts, whichever comes first."""

    def __init__(self, recorder: Recorder, name: str, open_backward: _OpenBackward) -> None:
        super().__init__(recorder, name)
        self._input: Any = None
        self.open_backward = open_backward
        # hooks on a leaf input (a pipeline stage's receive buffer, reused all run long) stay until removed:
        # removed here once their call's backward is over, as the hooks themselves cannot remove themselves
        self._leaf_hooks: list[tuple[_BlockBackward, Any]] = []

    def before_forward(self, module: Any, args: Any) -> None:
        super().before_forward(module, args)
        try:
            self._input = None if self._forward is None else _first_grad_tensor(args)
        except Exception:  # noqa: BLE001
            self._input = None

    def after_forward(self, _module: Any, _args: Any, output: Any) -> None:
        try:
            opened, self._forward = self._forward, None
            given, self._input = self._input, None
            if opened is None:
                return
            self._record("forward", *opened)
            if not _grad_enabled():
                return
            tensor = _first_grad_tensor(output)
            if tensor is None:
                return
            backward = _BlockBackward(self)
            _on_gradient(tensor, backward.started)
            if given is not None:
                handle = _on_gradient(given, backward.ended)
                if given.grad_fn is None:
                    self._keep_leaf_hook(backward, handle)
        except Exception:  # noqa: BLE001
            pass

    def _keep_leaf_hook(self, backward: _BlockBackward, handle: Any) -> None:
        kept = []
        for call, old in self._leaf_hooks:
            if call.finished or len(self._leaf_hooks) > MAX_LEAF_HOOKS:
                old.remove()
            else:
                kept.append((call, old))
        kept.append((backward, handle))
        self._leaf_hooks = kept


class _BlockBackward:
    """One call's backward through a block: opened at its output's gradient, closed at its input's, at the next
    block's opening, or at the end of the backward it runs in (a block fed by data). Opened once: a zero-bubble
    schedule's weight-gradient pass, which starts again at the block's output, opens nothing."""

    def __init__(self, timer: BlockTimer) -> None:
        self.timer = timer
        self.opened: tuple[int, Any, int] | None = None
        self.finished = False

    def started(self, _grad: Any) -> None:
        try:
            timer = self.timer
            shared = timer.open_backward
            if shared.block is not None and shared.block is not self:
                shared.block.ended(None)
            if self.finished or timer._skip():
                self.finished = True
                return
            self.opened = (local_ns(), timer._mark(), len(timer.recorder.blocked))
            shared.block = self
            shared.close_at_end()
        except Exception:  # noqa: BLE001
            self.opened = None

    def ended(self, _grad: Any) -> None:
        try:
            self.finished = True
            opened, self.opened = self.opened, None
            shared = self.timer.open_backward
            if shared.block is self:
                shared.block = None
            if opened is not None:
                self.timer._record("backward", *opened)
        except Exception:  # noqa: BLE001
            pass


LAYER_STEPS_APART: Final = 10
"""After its first ``LAYER_STEPS_FIRST`` timed steps, a process times its stages' layers on detailed steps at least
this many steps apart. Every step cost a 2-stage CPU demo job of tiny layers 7% of its step (hooks at ~20 µs a
layer call against ~0.5 ms layers), while a layer's cost is what a rebalance needs, not every step's."""
LAYER_STEPS_FIRST: Final = 10
"""Detailed steps timed one after another from the second step the layers run in (the first, step 0 or 1, runs
the stages' shape inference through them), so that a short run has them past the steps its analysis leaves out
as warm-up."""


class LayerSteps:
    """Which steps time their layers, decided once per step for every stage of a process."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.timed = False
        self.steps_seen = 0
        self.steps_timed = 0
        self.last = 0

    def timing(self, recorder: Recorder) -> bool:
        step = recorder.step_index
        if step != self.step:
            self.step = step
            self.steps_seen += 1
            due = self.steps_timed < LAYER_STEPS_FIRST or step - self.last >= LAYER_STEPS_APART
            self.timed = self.steps_seen > 1 and recorder.detailed and due
            if self.timed:
                self.steps_timed += 1
                self.last = step
        return self.timed


_layer_steps: weakref.WeakKeyDictionary[Recorder, LayerSteps] = weakref.WeakKeyDictionary()


class StageLayerTimer(BlockTimer):
    """A pipeline stage's layer (``stage_size.layer_groups``): timed while the schedule records the stage's
    actions, on the steps ``LayerSteps`` picks (a layer's cost is what rebalancing needs, not every step's)."""

    def __init__(self, recorder: Recorder, name: str, open_backward: _OpenBackward, steps: LayerSteps) -> None:
        super().__init__(recorder, name, open_backward)
        self.steps = steps

    def _skip(self) -> bool:
        recorder = self.recorder
        return bool(recorder.paused_depth or not self.steps.timing(recorder))


def instrument_stage_layers(module: Any, stage: int, recorder: Recorder) -> int:
    """Time each layer of pipeline stage ``stage``'s ``module`` as spans named ``wire.stage_layer_span_name``: a
    layer's forward from its first module's start to its last module's end, its backward as a block's. Returns
    the number of layers timed."""
    groups = layer_groups(module)
    if _compiled(module) or any(_compiled(part) for _, modules in groups for part in modules):
        return 0  # hooks inside a compiled region would be traced (a full graph refuses them): not timed
    open_backward = _OpenBackward()
    steps = _layer_steps.setdefault(recorder, LayerSteps())
    for name, modules in groups:
        timer = StageLayerTimer(recorder, wire.stage_layer_span_name(stage, name), open_backward, steps)
        modules[0].register_forward_pre_hook(timer.before_forward, prepend=True)
        modules[-1].register_forward_hook(timer.after_forward, prepend=True)
    return len(groups)


def _compiled(module: Any) -> bool:
    """``module.compile()`` (torchtitan compiles each block so) or ``torch.compile(module)``'s wrapper."""
    return getattr(module, "_compiled_call_impl", None) is not None or type(module).__name__ == "OptimizedModule"


def _block_names(module: Any, blocks: Any) -> list[tuple[Any, str]]:
    """Each block with its name in ``module`` (``layers.0``); ``blocks`` is a container module (its children),
    or an iterable of modules, each a descendant of ``module``."""
    if isinstance(blocks, torch.nn.Module):
        blocks = list(blocks.children())
    qualified = {id(sub): path for path, sub in module.named_modules() if path}
    named = []
    for block in blocks:
        path = qualified.get(id(block))
        if path is None:
            raise ValueError(f"blocks: {type(block).__name__} is not a submodule of the instrumented model")
        named.append((block, path))
    return named


def instrument_model(module: Any, recorder: Recorder, name: str | None = None, blocks: Any = None) -> ModelTimer:
    """Record ``module``'s every forward and backward as compute spans named ``name`` (default: its class), and
    each of ``blocks``' as spans named ``name/block`` (``wire.block_span_name``). A block that is not a submodule
    of ``module`` raises ValueError with the model's own hooks in place and no block's."""
    model_name = (name or type(module).__name__).replace(wire.BLOCK_SEPARATOR, "_")
    timer = ModelTimer(recorder, model_name)
    module.register_forward_pre_hook(timer.before_forward, prepend=True)
    module.register_forward_hook(timer.after_forward, prepend=True)
    named = _block_names(module, blocks) if blocks is not None else []  # a wrong block: the model's own spans stay
    open_backward = _OpenBackward()
    for block, path in named:
        block_timer = BlockTimer(recorder, wire.block_span_name(model_name, path), open_backward)
        block.register_forward_pre_hook(block_timer.before_forward, prepend=True)
        block.register_forward_hook(block_timer.after_forward, prepend=True)
    return timer
