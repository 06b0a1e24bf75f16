"""The in-job collector: ``from bubblescope import collector``.

::

    collector.init(run="llama-pp4")        # url, token, run, ...: also BUBBLESCOPE_* (config.py)
    collector.instrument(schedule)         # a torch.distributed.pipelining schedule
    collector.register_mesh(mesh)          # a DeviceMesh: coordinates and dp/tp/pp group labels
    collector.instrument_ddp(ddp_model)    # DDP's forward/backward and gradient buckets
    collector.instrument_model(model)      # forward/backward of any model (FSDP2, TP, a plain loop)
    collector.instrument_optimizer(opt)
    for batch in collector.timed_batches(loader):
        with collector.step():
            schedule.step(...)
    collector.shutdown()                   # also at exit: reports the rank finished

An uncaught exception that ends the process (``sys.excepthook`` is chained, not replaced), or
one propagating through the ``finally`` that calls ``shutdown()``, reports the rank failed with
its type and message. SIGTERM (torchrun tearing the other ranks down after one died) reports the
rank failed, terminated (``termination``). A killed rank (SIGKILL, the out-of-memory killer)
reports nothing: the service names it as the rank that went quiet first, and shows the run as
silent once nothing has been heard for a while.

Every torch.distributed collective and point-to-point call (and the functional collectives of
DTensor / tensor parallelism, which FSDP2 and TP use) is recorded once ``init`` has run after
``init_process_group`` (``BUBBLESCOPE_TRACE_COLLECTIVES=0`` turns that off). Hand-written
layer-wise model parallelism: ``collector.LayerwiseStage``.

Rules: nothing here raises into the training loop, blocks a step, or imports torch unless
the job already has; with ``BUBBLESCOPE_DISABLED=1`` (or before ``init``) every call is a no-op.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from bubblescope import wire
from bubblescope.collector import termination
from bubblescope.collector.clock import now_ns
from bubblescope.collector.config import CollectorConfig
from bubblescope.collector.model_parallel import LayerwiseStage
from bubblescope.collector.session import CollectorSession
from bubblescope.collector.stage_size import stage_sizes
from bubblescope.collector.upload import UploadResult, upload_spool

__all__ = [
    "LayerwiseStage",
    "UploadResult",
    "describe_pipeline",
    "init",
    "instrument",
    "instrument_ddp",
    "instrument_model",
    "instrument_optimizer",
    "is_enabled",
    "paused",
    "register_mesh",
    "run_key",
    "shutdown",
    "span",
    "step",
    "timed_batches",
    "upload_spool",
]

log = logging.getLogger("bubblescope.collector")
_NOOP = contextlib.nullcontext()
_session: CollectorSession | None = None
_warned_kinds: set[str] = set()
_uncaught: tuple[str, int] | None = None  # the exception ending this process and when (epoch ns)
_hook_installed = False
_ending = False  # shutdown() is reporting this rank's end (a SIGTERM handler then lets it finish)


def init(
    run: str | None = None,
    *,
    url: str | None = None,
    token: str | None = None,
    run_key: str | None = None,
    config: dict[str, Any] | None = None,
    spool_dir: str | os.PathLike[str] | None = None,
    full_spans_every: int | None = None,
) -> None:
    """Start collecting in this process. Safe to call on every rank; a second call is ignored.

    ``run`` names the run, ``run_key`` identifies this execution of it (all ranks must agree;
    derived from torchrun's run id or agreed over the process group when not given), ``config``
    is stored with the run (model size, batch, anything useful to read later). Each argument
    given wins over its ``BUBBLESCOPE_*`` variable; every setting is a field of
    ``config.CollectorConfig`` (docs/configuration.md).
    """
    global _session
    if _session is not None:
        return
    try:
        resolved = CollectorConfig.resolve(
            run_name=run,
            url=url,
            token=token,
            run_key=run_key,
            spool_dir=spool_dir,
            full_spans_every=full_spans_every,
        )
        if resolved.disabled:
            return
        _session = CollectorSession(resolved, config)
        atexit.register(shutdown)
        _note_uncaught_exceptions()
        termination.install(_report_termination, lambda: _ending)
    except Exception as error:  # noqa: BLE001 - a broken collector must not stop training
        log.warning("bubblescope: collector disabled, init failed: %r", error)
        _session = None


def _note_uncaught_exceptions() -> None:
    """Chain ``sys.excepthook`` once per process (it runs before the atexit shutdown) so that the
    rank's end is reported as failed, with the exception's type and message. The previous hook
    still runs."""
    global _uncaught, _hook_installed
    _uncaught = None
    if _hook_installed:
        return
    previous = sys.excepthook

    def note_and_pass_on(kind: type[BaseException], value: BaseException, traceback: Any) -> None:
        global _uncaught
        try:
            _uncaught = (_describe(value), now_ns())
        finally:  # the previous hook runs whatever happened here
            previous(kind, value, traceback)

    sys.excepthook = note_and_pass_on
    _hook_installed = True


def _describe(error: BaseException) -> str:
    """``Type: message``, or the type alone (no message, or a ``__str__`` that raises)."""
    try:
        text = str(error)
    except Exception:  # noqa: BLE001
        text = ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _ending_error() -> tuple[str | None, int]:
    """The exception this process ends on, and when: one the excepthook saw, or one still
    propagating through the ``finally`` (or ``__exit__``) that called ``shutdown()``."""
    if _uncaught is not None:
        return _uncaught
    propagating = sys.exc_info()[1]
    if propagating is None or (isinstance(propagating, SystemExit) and propagating.code in (None, 0)):
        return None, now_ns()
    return _describe(propagating), now_ns()


def is_enabled() -> bool:
    return _session is not None


def run_key() -> str | None:
    """The key this process reports under (None when disabled)."""
    return _session.run_key if _session is not None else None


def instrument(schedule: Any) -> Any:
    """Record every forward/backward action and P2P wait of a pipelining schedule; returns it."""
    if _session is None:
        return schedule
    try:
        from bubblescope.collector import pipelining

        _session.recorder.pipeline_compute = True
        pipelining.instrument_schedule(schedule, _session.recorder, time_layers=_session.config.stage_layers)
        _session.align_clock()
        described = pipelining.describe(schedule)
        stage_indices = described.pop("stage_indices")
        sizes = described.pop("stage_sizes")
        _session.register_run(**described)
        _session.register_rank(stage=stage_indices[0], stages=stage_indices, **sizes)
    except Exception as error:  # noqa: BLE001
        log.warning("bubblescope: could not instrument %s: %r", type(schedule).__name__, error)
    return schedule


def _guarded(what: str, action: Callable[[CollectorSession], object]) -> None:
    """Run ``action(session)`` unless the collector is off; a failure is logged, never raised."""
    if _session is None:
        return
    try:
        action(_session)
    except Exception as error:  # noqa: BLE001
        log.warning("bubblescope: could not %s: %r", what, error)


def register_mesh(mesh: Any, *more: Any) -> Any:
    """Record this rank's coordinate in every dimension of a DeviceMesh (or of several, e.g. a job's data-parallel
    and tensor-parallel meshes built apart, or torchtitan's ``ParallelDims``) and label each dimension's process
    group by its name ("dp", "tp", "pp", ...; torchtitan's fsdp, dp_shard, dp_replicate and the data-parallel
    meshes over them are "dp"); returns the first argument."""
    _guarded("register the mesh", lambda session: session.register_mesh(mesh, *more))
    return mesh


def instrument_model(model: Any, name: str | None = None, blocks: Any = None) -> Any:
    """Record every forward and backward of ``model`` (any ``nn.Module``: the root of an FSDP2 or tensor-parallel
    model, a plain one) as compute spans named ``name`` (default: its class), through module and autograd hooks;
    time it blocked waiting in a collective stays communication. Call it once per model, on the module your loop
    calls; a pipelining schedule (``instrument``) records its stages' compute itself. ``blocks``: the layers to
    price one by one (``model.layers``: its children; or a list of submodules), each recorded as its own spans
    for the run page's per-block costs (about two hooks' cost per block call). Returns the model."""
    from bubblescope.collector import model_hooks

    _guarded(
        "instrument the model", lambda session: model_hooks.instrument_model(model, session.recorder, name, blocks)
    )
    return model


def instrument_ddp(model: Any, hook: Any = None, state: Any = None, blocks: Any = None) -> Any:
    """Time a DistributedDataParallel model's forward and backward (``instrument_model`` on its ``module``, with
    ``blocks``) and each gradient bucket's all-reduce (bytes, group). Pass your own communication hook and state
    here instead of calling ``model.register_comm_hook``; returns the model."""
    from bubblescope.collector import integrations, model_hooks

    def instrument(session: CollectorSession) -> None:
        integrations.instrument_ddp(model, session.recorder, hook, state)
        inner = model.module
        model_hooks.instrument_model(inner, session.recorder, type(inner).__name__, blocks)

    _guarded("instrument DDP", instrument)
    return model


def instrument_optimizer(optimizer: Any) -> Any:
    """An ``optimizer`` span around every ``optimizer.step()``; returns the optimizer."""
    from bubblescope.collector import integrations

    _guarded("instrument the optimizer", lambda session: integrations.instrument_optimizer(optimizer, session.recorder))
    return optimizer


def timed_batches(batches: Any) -> Any:
    """Iterate ``batches``; waiting for each item is a ``data_loading`` span."""
    from bubblescope.collector import integrations

    return integrations.timed_batches(batches, _session.recorder if _session is not None else None)


def describe_pipeline(
    *,
    schedule: str,
    num_stages: int,
    num_microbatches: int,
    stages: list[int] | None = None,
    modules: list[Any] | None = None,
) -> None:
    """Tell the service how a hand-written pipeline is laid out (``instrument`` does this for
    torch's schedules): the schedule's name ("naive", "gpipe", "1f1b", ...), the stage count,
    micro-batches per step, the stage indices this rank runs and, optionally, their modules (in
    the same order), whose layers and parameters are counted so that stages can be rebalanced."""

    def register(session: CollectorSession) -> None:
        session.recorder.pipeline_compute = True  # its stages' spans are the compute
        local = stages or []
        session.register_run(
            schedule=schedule,
            num_stages=num_stages,
            num_microbatches=num_microbatches,
            virtual_stages=max(1, len(local)),
            pipeline_ranks=max(1, num_stages // max(1, len(local))),
        )
        session.align_clock()
        if local:
            sizes = stage_sizes(modules) if modules and len(modules) == len(local) else {}
            session.register_rank(stage=local[0], stages=local, **sizes)

    _guarded("describe the pipeline", register)


def step(number: int | None = None) -> contextlib.AbstractContextManager[Any]:
    """Context manager around one training step: marks the step window on this rank. ``number``: the step's
    number as the job counts it (torchtitan counts from 1); without it, steps are counted from 0."""
    if _session is None or _session.recorder.paused_depth:
        return _NOOP
    if number is not None and number >= 0:
        _session.recorder.step_index = int(number)
    return _session.recorder.step()


def span(kind: str, **fields: Any) -> contextlib.AbstractContextManager[Any]:
    """Time a block as one span: ``with collector.span("forward", microbatch=i, stage=s):``.

    ``kind`` is one of ``wire.SPAN_KINDS``; optional fields: stage, microbatch, peer, bytes,
    group, name. An unknown kind is reported once and not recorded. ``on_gpu=True`` times the
    block's GPU work with CUDA events on the current stream (when the job uses CUDA), not the
    host's launch time.
    """
    if _session is None or _session.recorder.paused_depth:
        return _NOOP
    if kind not in wire.SPAN_KINDS:
        if kind not in _warned_kinds:
            _warned_kinds.add(kind)
            log.warning("bubblescope: unknown span kind %r ignored; use one of %s", kind, sorted(wire.SPAN_KINDS))
        return _NOOP
    return _session.recorder.span(kind, **fields)


def paused() -> contextlib.AbstractContextManager[Any]:
    """Context manager: nothing this process does inside is recorded: no steps (they are not
    counted), spans, collectives or pipeline actions. For an evaluation loop, or steps run as an
    uninstrumented baseline. Nests; call it between steps, not inside one."""
    if _session is None:
        return _NOOP
    return _session.recorder.paused()


def _report_termination(timeout_s: float) -> None:
    """SIGTERM (``termination``): the rank ends failed, terminated; at most ``timeout_s`` to say so."""
    global _uncaught
    _uncaught = (termination.TERMINATED, now_ns())
    shutdown(timeout_s)


def shutdown(timeout_s: float | None = None) -> None:
    """Flush what is buffered (bounded wait: ``timeout_s``, else ``BUBBLESCOPE_SHUTDOWN_TIMEOUT_S``);
    what cannot be delivered stays in the spool."""
    global _session, _ending
    session, _session = _session, None
    if session is None:
        return
    _ending = True
    try:
        from bubblescope.collector import collectives, pipelining

        pipelining.detach()
        collectives.detach()
        session.report_end(*_ending_error())
        session.close(timeout_s)
    except Exception as error:  # noqa: BLE001
        log.warning("bubblescope: shutdown error ignored: %r", error)
