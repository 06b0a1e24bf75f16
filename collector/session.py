"""One collector session per process: identity, recorder, shipper and registrations."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import socket
import sys
import uuid
from typing import Any

from bubblescope import wire
from bubblescope.collector.clock import ClockOffset, estimate_offset_to_rank0
from bubblescope.collector.config import CollectorConfig
from bubblescope.collector.recorder import Recorder
from bubblescope.collector.shipper import Shipper
from bubblescope.collector.spool import Spool
from bubblescope.collector.transport import Message

log = logging.getLogger("bubblescope.collector")


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
    """A key every rank agrees on: given, torchrun's run id, or rank 0's broadcast; URL-safe."""
    return re.sub(r"[^A-Za-z0-9._:-]+", "-", _raw_run_key(config))[:128]


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
        self.rank, self.world_size = rank_and_world()
        self.run_key = _resolve_run_key(config)
        self.config = config
        self.run_config: dict[str, Any] = dict(run_config or {})
        self.clock: ClockOffset | None = None
        spool = Spool(config.spool_dir / self.run_key / f"rank{self.rank}", config.spool_max_bytes)
        self.shipper = Shipper(dataclasses.replace(config, run_key=self.run_key), self.rank, spool)
        self.recorder = Recorder(
            self.shipper.submit, self.shipper.count_dropped, config.max_buffered_spans
        )
        self.shipper.start()
        self.register_run()
        self.align_clock()

    def align_clock(self) -> None:
        """Estimate the offset to rank 0 once torch.distributed is up; then register this rank."""
        dist = _dist()
        if self.clock is None and dist is not None:
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
            try:
                self.clock = estimate_offset_to_rank0(dist)
            except Exception as error:  # noqa: BLE001
                log.warning("bubblescope: clock alignment failed (%r); assuming offset 0", error)
                self.clock = ClockOffset(0, 0)
        self.register_rank()

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
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "clock_offset_ns": clock.offset_ns,
            "clock_uncertainty_ns": clock.uncertainty_ns,
            **extra,
        }
        self._put(f"{wire.API_PREFIX}/runs/{self.run_key}/ranks/{self.rank}", body)

    def _put(self, path: str, body: dict[str, Any]) -> None:
        self.shipper.submit_message(Message("PUT", path, wire.encode_batch(body)))

    def close(self) -> None:
        self.shipper.stop(self.config.shutdown_timeout_s)
