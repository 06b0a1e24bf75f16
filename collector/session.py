"""One collector session per process: identity, recorder, shipper and registrations."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shlex
import socket
import sys
import urllib.parse
import uuid
from typing import Any

from bubblescope import wire
from bubblescope.collector import clock as process_clock
from bubblescope.collector.clock import ClockOffset
from bubblescope.collector.clock_sync import ClockSync
from bubblescope.collector.config import CollectorConfig
from bubblescope.collector.memory import CudaPeak, MemoryProbe, memory_limit_bytes
from bubblescope.collector.profiling import OnDemandProfiler, TraceUploader
from bubblescope.collector.recorder import Recorder
from bubblescope.collector.shipper import Shipper
from bubblescope.collector.spool import Spool
from bubblescope.collector.transport import Message

log = logging.getLogger("bubblescope.collector")

MAX_BUFFERED_SPANS = 100_000  # a step's span buffer; past it spans are dropped and counted


def _dist() -> Any | None:
    """torch.distributed if the job has already imported and initialised it (never imports torch)."""
    module = sys.modules.get("torch.distributed")
    try:
        if module is not None and module.is_available() and module.is_initialized():
            return module
    except Exception:  # noqa: BLE001
        return None
    return None


def rank_and_world() -> tuple[int, int]:
    dist = _dist()
    if dist is not None:
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _resolve_run_key(config: CollectorConfig) -> str:
    """A key every rank agrees on: given, torchrun's run id, or rank 0's broadcast; URL-safe, and not dots alone
    (``.`` and ``..`` are path segments: the service refuses them)."""
    key = re.sub(r"[^A-Za-z0-9._:-]+", "-", _raw_run_key(config))[:128]
    return key if key.strip(".") else key.replace(".", "-")


def _raw_run_key(config: CollectorConfig) -> str:
    if config.run_key:
        return config.run_key
    elastic = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if elastic and elastic != "none":
        return f"{config.run_name}-{elastic}"
    dist = _dist()
    if dist is not None and dist.get_world_size() > 1:
        holder = [uuid.uuid4().hex[:12] if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(holder, src=0)
        return f"{config.run_name}-{holder[0]}"
    return f"{config.run_name}-{uuid.uuid4().hex[:12]}"


class CollectorSession:
    def __init__(self, config: CollectorConfig, run_config: dict[str, Any] | None) -> None:
        process_clock.set_skew(config.clock_skew_ns)
        self.rank, self.world_size = rank_and_world()
        self.run_key = _resolve_run_key(config)
        self.config = config
        self.run_config: dict[str, Any] = dict(run_config or {})
        self.clock: ClockOffset | None = None
        self._clock_sync: ClockSync | None = None
        self._resync_every = config.clock_resync_steps
        spool = Spool(config.spool_dir / self.run_key / f"rank{self.rank}", config.spool_max_bytes)
        self.shipper = Shipper(dataclasses.replace(config, run_key=self.run_key), self.rank, spool)
        self.recorder = Recorder(
            self.shipper.submit, self.shipper.count_dropped, MAX_BUFFERED_SPANS, self.shipper.ships_spans_of
        )
        self.shipper.watch(self.recorder)
        profiles = config.spool_dir.parent / "profiles" / self.run_key  # beside the spool: the job's own disk
        uploader = None if config.url is None else TraceUploader(config.url, config.token, self.run_key)
        self.profiler = OnDemandProfiler(self.shipper.captures, profiles, self.rank, uploader)
        self.recorder.profile_hook = self.profiler.between_steps
        self.memory = MemoryProbe() if config.memory else None
        self.recorder.memory = self.memory
        self.shipper.start()
        if config.url is None:
            self._say_where_it_spools()
        elif self.rank == 0:
            self._say_where_to_look(config.url)
        self.register_run()
        self.align_clock()

    def _say_where_to_look(self, url: str) -> None:
        """Rank 0 prints the run's page once: the run key carries torchrun's run id, which nobody types."""
        page = f"{url}/runs/{urllib.parse.quote(self.run_key, safe='')}"
        print(f"bubblescope: run {self.config.run_name!r} streams to {page}", file=sys.stderr, flush=True)

    def _say_where_it_spools(self) -> None:
        """No service URL: everything goes to disk, which a first run should hear about (once per
        host: its local rank 0; each host spools to its own disk)."""
        try:
            first_on_host = int(os.environ.get("LOCAL_RANK", self.rank)) == 0
        except ValueError:
            first_on_host = self.rank == 0
        if first_on_host:
            folder = self.config.spool_dir / self.run_key
            log.warning(
                "bubblescope: no service URL (init(url=...) or BUBBLESCOPE_URL): the timings are spooled to %s; "
                "deliver them later with: bubblescope upload-spool --url URL --spool-dir %s",
                folder,
                shlex.quote(str(folder)),
            )

    def align_clock(self) -> None:
        """Once torch.distributed is up: trace its collectives, estimate the clock offset to
        rank 0 (then again every ``BUBBLESCOPE_CLOCK_RESYNC_STEPS`` steps), register this rank."""
        dist = _dist()
        if self._clock_sync is None and dist is not None:
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
            if self.config.trace_collectives:
                from bubblescope.collector import collectives

                collectives.install(self.recorder)
            self._enable_gpu_readings()
            try:
                timeout_s = self.config.clock_handshake_timeout_s
                self._clock_sync = ClockSync(dist, self.run_key, first_timeout_s=timeout_s)
                self._use_clock(self._clock_round(0) or ClockOffset(0, 0))
                self.recorder.after_step = self._between_steps
            except Exception as error:  # noqa: BLE001
                log.warning("bubblescope: clock alignment failed (%r); assuming offset 0", error)
                self._use_clock(ClockOffset(0, 0))
        self.register_rank()

    def _uses_cuda(self) -> bool:
        torch = sys.modules.get("torch")
        if torch is None:
            return False
        try:
            dist = _dist()
            on_nccl = dist is not None and dist.get_backend() == "nccl"
            return bool(torch.cuda.is_available() and (on_nccl or torch.cuda.is_initialized()))
        except Exception:  # noqa: BLE001
            return False

    def _enable_gpu_readings(self) -> None:
        """When the job computes on a GPU: CUDA-event timing (``BUBBLESCOPE_GPU_TIMING=0``: off) and
        the allocator's peaks (``BUBBLESCOPE_MEMORY=0``: off)."""
        if not self._uses_cuda():
            return
        try:
            if self.config.gpu_timing:
                from bubblescope.collector.gpu_timing import CudaStepClock

                self.recorder.gpu = CudaStepClock()
            if self.memory is not None:
                self.memory.gpu = CudaPeak()
        except Exception as error:  # noqa: BLE001
            log.warning("bubblescope: GPU timing off: %r", error)

    def _clock_round(self, round_id: int) -> ClockOffset | None:
        assert self._clock_sync is not None
        with self.recorder.quiet():
            return self._clock_sync.run_round(round_id)

    def _use_clock(self, clock: ClockOffset) -> None:
        self.clock = clock
        self.recorder.clock = (clock.offset_ns, clock.uncertainty_ns)

    def _between_steps(self, next_step: int) -> None:
        """Periodic clock rounds; every rank reaches the same step number, so they meet."""
        if not self._resync_every or next_step % self._resync_every or self._clock_sync is None:
            return
        try:
            clock = self._clock_round(next_step // self._resync_every)
            if clock is not None:
                self._use_clock(clock)
        except Exception as error:  # noqa: BLE001
            log.warning("bubblescope: periodic clock round failed (%r); keeping the last offset", error)
            self.recorder.after_step = None

    def register_mesh(self, *meshes: Any) -> None:
        """Label each mesh dimension's process group by the dimension's name and register this
        rank's coordinate in every dimension of every mesh (a dimension named twice: the last mesh's); a
        torchtitan ``ParallelDims`` stands for its one-dimensional meshes (``mesh_dimensions``)."""
        from bubblescope.collector import collectives, mesh_dimensions

        coords: dict[str, int] = {}
        for mesh in meshes:
            if hasattr(mesh, "get_all_one_dimensional_meshes"):  # torchtitan's ParallelDims
                for name, group, value in mesh_dimensions.parallel_dims_dimensions(mesh):
                    collectives.register_group(group, name)
                    if value is not None:
                        coords[name] = int(value)
                continue
            names = list(mesh.mesh_dim_names or [f"dim{i}" for i in range(mesh.ndim)])
            coordinate = mesh.get_coordinate() or []
            for index, name in enumerate(names):
                collectives.register_group(mesh.get_group(index), name)
            coords.update({name: int(value) for name, value in zip(names, coordinate)})
        self.register_rank(coords=coords)

    def register_run(self, **updates: Any) -> None:
        self.run_config.update(updates)
        body = {
            "name": self.config.run_name,
            "world_size": self.world_size,
            "config": self.run_config,
        }
        self._put(f"{wire.API_PREFIX}/runs/{self.run_key}", body)

    def register_rank(self, **extra: Any) -> None:
        clock = self.clock or ClockOffset(0, 0)
        body = {
            "host": self.config.hostname or socket.gethostname(),
            "pid": os.getpid(),
            "clock_offset_ns": clock.offset_ns,
            "clock_uncertainty_ns": clock.uncertainty_ns,
            **extra,
        }
        if self.memory is not None:
            limit = memory_limit_bytes(on_gpu=self.memory.gpu is not None)
            if limit is not None:
                body["memory_limit_bytes"] = limit
        self._put(f"{wire.API_PREFIX}/runs/{self.run_key}/ranks/{self.rank}", body)

    def report_end(self, error: str | None, at_ns: int) -> None:
        """Tell the service how this rank ended (at ``at_ns``, epoch ns): failed with ``error``, or finished."""
        clock = self.clock or ClockOffset(0, 0)
        body: dict[str, Any] = {
            "outcome": "finished",
            "end_ns": at_ns,
            "clock_offset_ns": clock.offset_ns,
            "pid": os.getpid(),  # an end arriving after a restarted worker registered is ignored
        }
        if error is not None:
            body.update(outcome="failed", error=error[:1000])
        self._put(f"{wire.API_PREFIX}/runs/{self.run_key}/ranks/{self.rank}/end", body, past_a_full_inbox=True)

    def _put(self, path: str, body: dict[str, Any], past_a_full_inbox: bool = False) -> None:
        self.shipper.submit_message(Message("PUT", path, wire.encode_batch(body)), past_a_full_inbox)

    def close(self, timeout_s: float | None = None) -> None:
        self.profiler.join(self.config.shutdown_timeout_s if timeout_s is None else timeout_s)
        self.shipper.stop(
            self.config.shutdown_timeout_s if timeout_s is None else min(timeout_s, self.config.shutdown_timeout_s)
        )
