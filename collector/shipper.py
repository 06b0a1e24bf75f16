"""The background shipper: turns finished steps into batches and delivers them.

The training thread only calls :meth:`Shipper.submit` (a non-blocking queue put; a full queue
drops the step and counts its spans). This thread computes per-step aggregates, groups steps
into batches, and sends them with a timeout and capped retries. When the service is down the
messages go to the on-disk spool, in order, and are re-sent once it answers again.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from bubblescope import wire
from bubblescope.collector.aggregate import step_aggregate
from bubblescope.collector.config import CollectorConfig
from bubblescope.collector.recorder import StepRecord
from bubblescope.collector.spool import Spool
from bubblescope.collector.transport import Message, Verdict, send

log = logging.getLogger("bubblescope.collector")

_STOP = object()
_MAX_DOWN_BACKOFF_S = 30.0


class Shipper:
    def __init__(self, config: CollectorConfig, rank: int, spool: Spool) -> None:
        self.config = config
        self.rank = rank
        self.spool = spool
        self.run_key = config.run_key or ""
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=config.queue_steps)
        self._seq = 0
        self._pending_steps: list[StepRecord] = []
        self._pending_span_count = 0
        self._last_flush = time.monotonic()
        self._down_until = 0.0
        self._down_backoff_s = 1.0
        self._deadline: float | None = None
        self.dropped_spans = 0
        self._warned: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="bubblescope-shipper", daemon=True)

    # ---- training-thread side -------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, record: StepRecord) -> None:
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.count_dropped(len(record.spans))

    def count_dropped(self, spans: int) -> None:
        """Spans lost anywhere in this rank; shipped with every batch and shown by the service."""
        self.dropped_spans += spans

    def submit_message(self, message: Message) -> None:
        try:
            self._queue.put_nowait(message)
        except queue.Full:
            self._warn_once("queue-full", "bubblescope: queue full, a registration was dropped")

    def stop(self, timeout_s: float) -> None:
        """Flush what is queued within ``timeout_s``; what cannot be sent by then is spooled."""
        self._deadline = time.monotonic() + timeout_s
        self._down_until = 0.0  # one last try: the service may be back (failures re-arm the backoff)
        try:
            self._queue.put(_STOP, timeout=timeout_s)
        except queue.Full:
            pass
        self._thread.join(timeout_s + self.config.request_timeout_s + 1.0)

    # ---- shipper-thread side --------------------------------------------------------------
    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=self.config.flush_interval_s)
            except queue.Empty:
                item = None
            try:
                if item is _STOP:
                    self._flush()
                    return
                if isinstance(item, Message):
                    self._flush()
                    self._deliver(item)
                elif isinstance(item, StepRecord):
                    self._pending_steps.append(item)
                    self._pending_span_count += len(item.spans)
                due = time.monotonic() - self._last_flush >= self.config.flush_interval_s
                if due or self._pending_span_count >= self.config.max_batch_spans:
                    self._flush()
            except Exception as error:  # noqa: BLE001 - the shipper must outlive any bug
                self._warn_once("bug", f"bubblescope: shipper error ignored: {error!r}")

    def _flush(self) -> None:
        self._last_flush = time.monotonic()
        if not self._pending_steps:
            return
        steps, self._pending_steps = self._pending_steps, []
        self._pending_span_count = 0
        rows: list[tuple[Any, ...]] = []
        aggregates = []
        for record in steps:
            aggregates.append(step_aggregate(record))
            if record.step % self.config.full_spans_every == 0:
                rows.extend(record.spans)
        batch = {
            "run_key": self.run_key,
            "rank": self.rank,
            "seq": self._seq,
            "dropped_spans": self.dropped_spans,
            "steps": aggregates,
            "spans": wire.spans_to_columns(rows),
        }
        self._seq += 1
        self._deliver(Message("POST", f"{wire.API_PREFIX}/ingest", wire.encode_batch(batch)))

    def _deliver(self, message: Message) -> None:
        if self.spool.has_pending() and not self._drain_spool():
            self._to_spool(message)
            return
        if not self._send(message):
            self._to_spool(message)

    def _drain_spool(self) -> bool:
        """Re-send spooled messages oldest first; True when the spool is empty afterwards."""
        for path, message in self.spool.pending():
            if not self._send(message):
                return False
            self.spool.remove(path)
        return not self.spool.has_pending()

    def _send(self, message: Message) -> bool:
        """True when the message needs no more work (delivered, or rejected for good)."""
        if self.config.url is None:
            return False
        attempts = self.config.max_attempts
        for attempt in range(attempts):
            now = time.monotonic()
            if now < self._down_until or (self._deadline is not None and now > self._deadline):
                return False
            response = send(self.config.url, message, self.config.token, self.config.request_timeout_s)
            if response.verdict is Verdict.DELIVERED:
                self._down_backoff_s = 1.0
                return True
            if response.verdict is Verdict.REJECTED:
                self._warn_once(
                    f"rejected-{response.status}",
                    f"bubblescope: service rejected {message.path} ({response.status}): "
                    f"{response.body[:500]!r}",
                )
                return True
            if attempt + 1 < attempts:
                time.sleep(min(0.2 * 2**attempt, 1.0))
        self._down_until = time.monotonic() + self._down_backoff_s
        self._down_backoff_s = min(self._down_backoff_s * 2, _MAX_DOWN_BACKOFF_S)
        self._warn_once("down", f"bubblescope: service unreachable at {self.config.url}; spooling")
        return False

    def _to_spool(self, message: Message) -> None:
        if not self.spool.write(message):
            self._warn_once("spool-full", "bubblescope: spool full or unwritable; dropping data")

    def _warn_once(self, key: str, text: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(text)
