"""Spans for DDP gradient buckets, optimizer steps and data loading.

- DDP's reducer calls its process group from C++, out of sight of the collectives layer. A
  communication hook sees each bucket: ``instrument_ddp`` registers one that runs the job's
  own hook (default: DDP's plain all-reduce) and records an ``all_reduce`` span per bucket,
  with the bucket's bytes, from the hook's call until its future completes (stamped by the
  thread completing it, in a callback chained into the future DDP waits for before
  ``backward()`` returns). On CUDA, with GPU timing, the span's ends are CUDA events: the start
  on the stream issuing the bucket's collective, the end recorded in that callback, whose
  current stream waits for the collective (``gpu_timing``).
- ``instrument_optimizer`` uses the optimizer's step pre/post hooks.
- ``timed_batches`` wraps an iterable; each ``next()`` is a ``data_loading`` span.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from bubblescope.collector.clock import local_ns
from bubblescope.collector.collectives import group_label
from bubblescope.collector.gpu_timing import issue_event
from bubblescope.collector.recorder import Recorder

Item = TypeVar("Item")


def instrument_ddp(model: Any, recorder: Recorder, hook: Callable[..., Any] | None, state: Any) -> None:
    """Register a timing communication hook on a DistributedDataParallel ``model``."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    if hook is None:  # DDP's own behaviour: all-reduce each bucket over its process group
        hook, state = default_hooks.allreduce_hook, model.process_group
    label = group_label(model.process_group)

    def timed_hook(hook_state: Any, bucket: Any) -> Any:
        if recorder.paused_depth:  # records nothing: no events, no callback
            return hook(hook_state, bucket)
        buffer = bucket.buffer()
        clock = recorder.gpu
        start = local_ns()  # before the start event: the GPU placement's bound
        start_event = issue_event(clock, buffer)
        size = int(buffer.numel() * buffer.element_size())
        name = f"ddp_bucket_{bucket.index()}"
        with recorder.quiet():  # the bucket span below covers the collective inside
            future = hook(hook_state, bucket)

        def finished(done: Any) -> Any:
            try:  # an error here would fail DDP's backward: the span is dropped instead
                if start_event is None or clock is None:
                    recorder.add("all_reduce", start, local_ns(), None, None, None, size, label, name)
                else:  # runs on a stream made to wait for the bucket's collective: the event marks its end
                    recorder.add_gpu(
                        "all_reduce",
                        start_event,
                        clock.mark(),
                        None,
                        None,
                        None,
                        size,
                        label,
                        name,
                        host_start_ns=start,
                    )
            except Exception:  # noqa: BLE001
                pass
            return done.value()

        # Chained, so DDP waits for this callback too: the span lands in the step that made it.
        return future.then(finished)

    timed_hook.__annotations__ = {}  # DDP checks annotations; postponed ones are strings here
    model.register_comm_hook(state, timed_hook)


def instrument_optimizer(optimizer: Any, recorder: Recorder) -> None:
    """An ``optimizer`` span around every ``optimizer.step()``."""
    started: list[int] = [0]

    def before(_optimizer: Any, _args: Any, _kwargs: Any) -> None:
        started[0] = local_ns()

    def after(_optimizer: Any, _args: Any, _kwargs: Any) -> None:
        recorder.add("optimizer", started[0], local_ns(), None, None, None, None, None, type(optimizer).__name__)

    optimizer.register_step_pre_hook(before)
    optimizer.register_step_post_hook(after)


def timed_batches(batches: Iterable[Item], recorder: Recorder | None) -> Iterator[Item]:
    """Yield from ``batches``; the time each item takes to arrive is a ``data_loading`` span."""
    iterator = iter(batches)
    while True:
        start = local_ns()
        try:
            item = next(iterator)
        except StopIteration:
            return
        if recorder is not None:
            recorder.add("data_loading", start, local_ns())
        yield item
