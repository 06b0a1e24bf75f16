"""The background shipper: turns finished steps into batches and delivers them.

The training thread only calls :meth:`Shipper.submit`: an append to a bounded inbox (a full
inbox drops the step and counts its spans) that wakes this thread only when the inbox holds a
batch's worth of spans, so most steps cost no thread switch; otherwise this thread flushes on
its own clock, once per ``flush_interval_s`` (or the longer interval the service's ingest answers
ask for a big run: ``adopted_interval``). It computes per-step aggregates, groups steps
into batches, and sends them with a timeout and capped retries. When the service is down the
messages go to the on-disk spool, in order, and are re-sent once it answers again.

Which spans travel: aggregates of every step; full spans of every ``full_spans_every``-th step
and of the steps the service asked to capture (``capture.CaptureWindows``, learned from the
ingest answers). The recorder asks the same question (``ships_spans_of``) at each step's start,
to record in full detail only the steps that will travel in full, so a request learned now
applies to every step not started yet.
"""

from __future__ import annotations

import logging
import math
import shlex
import statistics
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bubblescope import wire
from bubblescope.collector.aggregate import span_columns, step_aggregate
from bubblescope.collector.capture import CaptureWindows
from bubblescope.collector.clock import local_ns
from bubblescope.collector.config import CollectorConfig
from bubblescope.collector.recorder import Recorder, StepRecord, waiting_op
from bubblescope.collector.spool import Spool
from bubblescope.collector.transport import Message, Response, Verdict, readable, send

log = logging.getLogger("bubblescope.collector")

_STOP = object()
_MAX_DOWN_BACKOFF_S = 30.0
MAX_BATCH_SPANS = 20_000  # a batch's worth: the training thread wakes the shipper at this many
QUEUE_STEPS = 4096  # the inbox's bound in steps; past it a step is dropped and its spans counted
MAX_ATTEMPTS = 3  # sends of one message before it is spooled
_INGEST_PATH = f"{wire.API_PREFIX}/ingest"
WATCHDOG_STEP_FACTOR = 3.0  # a step this many times its usual length (and watchdog_after_s) is reported
WATCHDOG_EVERY_S = 5.0  # while it lasts, a report this often: the rank is alive, and where it waits
USUAL_STEPS = 20  # the usual length: the median of this many newest steps
TOKEN_REFUSED_BACKOFF_S = 60.0  # a refused token is tried again this often (it may be created meanwhile)


def adopted_interval(configured_s: float, answer: Any) -> float:
    """The flush interval after an ingest answer: the service's ``flush_interval_s`` (longer for a big
    run) where it is a sane number, never shorter than the one configured."""
    asked = answer.get("flush_interval_s") if isinstance(answer, dict) else None
    if isinstance(asked, bool) or not isinstance(asked, (int, float)) or not math.isfinite(asked):
        return configured_s
    return max(configured_s, min(float(asked), wire.MAX_FLUSH_INTERVAL_S))


class Shipper:
    def __init__(
        self,
        config: CollectorConfig,
        rank: int,
        spool: Spool,
        *,
        max_batch_spans: int = MAX_BATCH_SPANS,
        queue_steps: int = QUEUE_STEPS,
        max_attempts: int = MAX_ATTEMPTS,
    ) -> None:
        """``config`` holds the user's settings; the limits after it are fixed in a job (tests
        shrink them)."""
        self.config = config
        self.rank = rank
        self.spool = spool
        self.max_batch_spans = max_batch_spans
        self.queue_steps = queue_steps
        self.max_attempts = max_attempts
        self.run_key = config.run_key or ""
        self.captures = CaptureWindows()
        # Inbox: appended by the training thread, popped by this one (deque ends are thread-safe)
        self._inbox: deque[Any] = deque()
        self._wake = threading.Event()
        # Per process, not from 0: a worker restarted under the same run key (torchrun --max-restarts)
        # must not send seqs its predecessor used, or the service would drop its batches as retries.
        self._seq = time.time_ns() // 1000
        self._pending_steps: list[StepRecord] = []
        self._pending_span_count = 0
        self._last_flush = time.monotonic()
        self._interval = config.flush_interval_s  # lengthened when the service asks (adopted_interval)
        self._flush_due_at = self._last_flush + self._interval
        self._wake_at_spans = self.max_batch_spans  # read by the training thread, written here only
        self._submitted_spans = 0  # training thread only
        self._taken_spans = 0  # shipper thread only
        self._down_until = 0.0
        self._down_backoff_s = 1.0
        self._deadline: float | None = None
        # Two counters, each written by one thread only, so no lock is needed on the hot path.
        self._dropped_in_job = 0  # training thread: full queue, recorder buffer overflow
        self._dropped_here = 0  # shipper thread: spool full, message rejected for good
        self._warned: set[str] = set()
        # The watchdog's view of the training thread (read here, written there: see Recorder.waiting)
        self._recorder: Recorder | None = None
        self._step_lengths: deque[int] = deque(maxlen=USUAL_STEPS)
        self._last_step_end: int | None = None
        self._stall_reported_at = 0.0
        self._thread = threading.Thread(target=self._run, name="bubblescope-shipper", daemon=True)

    @property
    def dropped_spans(self) -> int:
        """Spans lost anywhere in this rank; shipped with every batch and shown by the service."""
        return self._dropped_in_job + self._dropped_here

    def watch(self, recorder: Recorder) -> None:
        """Report ``recorder``'s step when it runs far past its usual length (``_watch``)."""
        self._recorder = recorder

    # ---- training-thread side -------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, record: StepRecord) -> None:
        inbox = self._inbox
        if len(inbox) >= self.queue_steps:
            self.count_dropped(len(record.spans))
            return
        self._submitted_spans += len(record.spans)
        inbox.append(record)
        if self._submitted_spans >= self._wake_at_spans:
            self._wake.set()

    def count_dropped(self, spans: int) -> None:
        self._dropped_in_job += spans

    def submit_message(self, message: Message, past_a_full_inbox: bool = False) -> None:
        """Queue a registration; one past a full inbox only for the last (the rank's end): one
        item more, sent (or spooled) before the stop."""
        if len(self._inbox) >= self.queue_steps and not past_a_full_inbox:
            self._warn_once("queue-full", "bubblescope: queue full, a registration was dropped")
            return
        self._inbox.append(message)
        self._wake.set()

    def stop(self, timeout_s: float) -> None:
        """Flush what is queued; returns within ``timeout_s`` plus one request timeout at most.

        No delivery attempt starts after ``timeout_s``; what is not delivered by then is spooled.
        One attempt may be under way at the deadline, hence the extra request timeout.
        """
        self._deadline = time.monotonic() + timeout_s
        self._down_until = 0.0  # one last try: the service may be back (failures re-arm the backoff)
        self._inbox.append(_STOP)  # past a full inbox too: one item more, and the thread ends
        self._wake.set()
        remaining = max(0.0, self._deadline - time.monotonic())
        self._thread.join(remaining + self.config.request_timeout_s + 0.5)

    # ---- shipper-thread side --------------------------------------------------------------
    def _run(self) -> None:
        while True:
            # Flushes on its own clock: the flush's work lands wherever in a step its time falls,
            # not always after the step that woke it (so a step the job runs inside
            # collector.paused() bears it as often as one recorded). The training thread wakes it
            # early only when a batch's worth of spans waits.
            self._wake.wait(max(0.0, min(self._flush_due_at - time.monotonic(), WATCHDOG_EVERY_S)))
            self._wake.clear()  # before draining: an append after this point sets it again
            try:
                if self._take_inbox():
                    return
                due = time.monotonic() >= self._flush_due_at
                if due or self._pending_span_count >= self.max_batch_spans:
                    self._flush()
                self._watch()
            except Exception as error:  # noqa: BLE001 - the shipper must outlive any bug
                self._warn_once("bug", f"bubblescope: shipper error ignored: {error!r}")
                self._flush_due_at = max(self._flush_due_at, time.monotonic() + self._interval)

    def _take_inbox(self) -> bool:
        """Take what the inbox holds now, flushing at each batch's worth of spans, so that a
        backlog left by a slow send goes out in few large batches. True on stop."""
        for _ in range(len(self._inbox)):  # what is there now: bounded even if steps keep coming
            if self._pending_span_count >= self.max_batch_spans:
                self._flush()
            if self._take(self._inbox.popleft()):
                return True
        return False

    def _take(self, item: Any) -> bool:
        """Handle one queue item; True when it was the stop signal (after the final flush)."""
        if item is _STOP:
            try:
                self._flush()
            except Exception as error:  # noqa: BLE001 - stop even if the last flush failed
                self._warn_once("bug", f"bubblescope: shipper error ignored: {error!r}")
            return True
        if isinstance(item, Message):
            self._flush()
            self._deliver(item)
        elif isinstance(item, StepRecord):
            self._step_lengths.append(item.end_ns - item.start_ns)
            self._last_step_end = item.end_ns
            self._pending_steps.append(item)
            self._pending_span_count += len(item.spans)
            self._taken_spans += len(item.spans)
            if len(self._pending_steps) >= wire.MAX_BATCH_STEPS:  # the service refuses longer batches
                self._flush()
        return False

    def _watch(self) -> None:
        """The watchdog: while the training thread's step (or the gap after its last step) runs
        past ``watchdog_after_s`` and ``WATCHDOG_STEP_FACTOR`` times the usual step, send the
        service a step-less batch saying so, with the op it is blocked in, every
        ``WATCHDOG_EVERY_S``. Reads two attributes of the recorder; nothing on the training thread."""
        recorder = self._recorder
        if recorder is None or self.config.watchdog_after_s <= 0 or self._service_down():
            return
        if time.monotonic() - self._stall_reported_at < WATCHDOG_EVERY_S:
            return
        started = recorder.step_start_ns
        since = started if started is not None else self._last_step_end
        if since is None:  # before the first step: loading and compiling take what they take
            return
        usual = statistics.median(self._step_lengths) if self._step_lengths else 0
        now = local_ns()
        if now - since < max(self.config.watchdog_after_s * 1e9, WATCHDOG_STEP_FACTOR * usual):
            return
        op = waiting_op(recorder.waiting)
        if op is not None:
            op["elapsed_s"] = max(0.0, (now - op.pop("since_ns")) / 1e9)
        report = {"step": recorder.step_index, "in_step": started is not None, "elapsed_s": (now - since) / 1e9}
        batch = {**self._batch([], wire.spans_to_columns([])), "in_flight": {**report, "op": op}}
        self._stall_reported_at = time.monotonic()
        self._send(Message("POST", _INGEST_PATH, wire.encode_batch(batch)))  # not spooled: stale once late

    def ships_spans_of(self, step: int) -> bool:
        """Whether ``step`` travels in full: asked by the recorder at the step's start (on the
        training thread; ``captures.covers`` reads an immutable snapshot)."""
        return step % self.config.full_spans_every == 0 or self.captures.covers(step)

    def _flush(self) -> None:
        self._last_flush = time.monotonic()
        self._flush_due_at = self._last_flush + self._interval
        self._wake_at_spans = self._taken_spans + self.max_batch_spans
        if not self._pending_steps:
            return
        steps, self._pending_steps = self._pending_steps, []
        self._pending_span_count = 0
        rows: list[tuple[Any, ...]] = []
        aggregates = []
        for record in steps:
            aggregates.append(step_aggregate(record))
            # A step recorded without detail (a capture learned after it started) travels as
            # its aggregate only: its P2P spans lack the micro-batch labels the service matches.
            if record.detailed and self.ships_spans_of(record.step):
                rows.extend(record.spans)
        batch = self._batch(aggregates, span_columns(rows))
        message = Message("POST", _INGEST_PATH, wire.encode_batch(batch), span_count=len(rows))
        self._deliver(message, lambda: self._without_spans(batch))
        self.captures.shipped_through(max(record.step for record in steps))

    def _batch(self, aggregates: list[dict[str, Any]], spans: dict[str, list[Any]]) -> dict[str, Any]:
        batch = {
            "run_key": self.run_key,
            "rank": self.rank,
            "seq": self._seq,
            "dropped_spans": self.dropped_spans,
            "steps": aggregates,
            "spans": spans,
        }
        self._seq += 1
        return batch

    def _without_spans(self, batch: dict[str, Any]) -> Message:
        """The same batch (same seq) with its aggregates only, for when the spool has no room for
        its spans: the steps still reach the service, and so does the new drop count."""
        reduced = {**batch, "spans": wire.spans_to_columns([]), "dropped_spans": self.dropped_spans}
        return Message("POST", _INGEST_PATH, wire.encode_batch(reduced))

    def _deliver(self, message: Message, without_spans: Callable[[], Message] | None = None) -> None:
        if self._service_down() and self._deadline is None:
            self._to_spool(message, without_spans)  # nothing to try yet: skip reading the spool
            return
        if self.spool.has_pending() and not self._drain_spool():
            self._to_spool(message, without_spans)
            return
        if not self._send(message):
            self._to_spool(message, without_spans)

    def _service_down(self) -> bool:
        return self.config.url is None or time.monotonic() < self._down_until

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
        attempts = self.max_attempts
        for attempt in range(attempts):
            timeout_s = self._attempt_timeout()
            if timeout_s is None:
                return False
            response = send(self.config.url, message, self.config.token, timeout_s)
            if response.verdict is Verdict.DELIVERED:
                self._down_backoff_s = 1.0
                if response.document is not None and message.path == _INGEST_PATH:
                    self.captures.learn(response.document)
                    self._interval = adopted_interval(self.config.flush_interval_s, response.document)
                    self._flush_due_at = self._last_flush + self._interval
                return True
            if response.verdict is Verdict.REJECTED:  # for good: the same message would be refused again
                self._dropped_here += message.span_count
                kept = self.spool.keep_rejected(message)
                where = (
                    f"kept as *.rejected in {self.spool.directory}"
                    if kept
                    else "not kept (the spool's bound, or its disk, has no room)"
                )
                self._warn_once(
                    f"rejected-{response.status}",
                    f"bubblescope: the service refused {message.method} {message.path} ({response.status}: "
                    f"{readable(response.body)}); that message is {where}, not sent again (its spans counted as "
                    "dropped); the next ones are sent",
                )
                return True
            if response.verdict in (Verdict.UNAUTHORIZED, Verdict.MISADDRESSED):  # keep everything: it can be fixed
                self._down_until = time.monotonic() + TOKEN_REFUSED_BACKOFF_S
                self._warn_once(response.verdict.value, self._refusal(message, response))
                return False
            if response.retry_after_s is not None:  # busy or its database away: come back when told
                self._down_until = time.monotonic() + response.retry_after_s
                self._warn_once("busy", f"bubblescope: service busy ({response.status}); spooling, retrying later")
                return False
            if attempt + 1 < attempts:
                self._pause(min(0.2 * 2**attempt, 1.0))
        self._down_until = time.monotonic() + self._down_backoff_s
        self._down_backoff_s = min(self._down_backoff_s * 2, _MAX_DOWN_BACKOFF_S)
        self._warn_once(
            "down",
            f"bubblescope: service unreachable at {self.config.url} ({response.error}); spooling to {self._folder()}, "
            f"sent when it answers again; or later with: {self._upload_command()}",
        )
        return False

    def _folder(self) -> Path:
        """The run's spool folder on this host (every rank's below it): what ``upload-spool`` delivers."""
        return self.spool.directory.parent

    def _upload_command(self, url: str | None = None) -> str:
        given = shlex.quote(url or self.config.url or "URL")
        return f"bubblescope upload-spool --url {given} --spool-dir {shlex.quote(str(self._folder()))}"

    def _refusal(self, message: Message, response: Response) -> str:
        """One line: what was refused, why, and how to get the spooled timings delivered."""
        answer = f"{response.status}: {readable(response.body)}"
        keep = f"spooling everything to {self._folder()}; once fixed, deliver it with: {self._upload_command()}"
        if response.verdict is Verdict.MISADDRESSED:
            parts = urllib.parse.urlsplit(self.config.url or "")
            root = f"{parts.scheme}://{parts.netloc}"
            return (
                f"bubblescope: {self.config.url} has no bubblescope API ({message.method} {message.path}: {answer}): "
                f"BUBBLESCOPE_URL should be the service's root, such as {root}; spooling everything to "
                f"{self._folder()}; once fixed, deliver it with: {self._upload_command(root)}"
            )
        if not self.config.token:  # the service's own words are for a browser (sign in); a job needs a token
            return (
                f"bubblescope: the service requires a token and this job set none ({message.method} {message.path}: "
                f"{response.status}): set BUBBLESCOPE_TOKEN to an ingest token (bubblescope token create --scope "
                f"ingest); {keep}"
            )
        bound_elsewhere = response.status == 403 and "run_key" in answer  # a valid token, bound to other runs
        fix = (
            "BUBBLESCOPE_TOKEN is bound to other runs: run under a key it allows (BUBBLESCOPE_RUN_ID), or use a "
            "token bound to this one"
            if bound_elsewhere
            else "BUBBLESCOPE_TOKEN must be an ingest token that is not revoked"
        )
        return (
            f"bubblescope: the service refused this job's token ({message.method} {message.path}: {answer}): "
            f"{fix}; {keep}"
        )

    def _attempt_timeout(self) -> float | None:
        """The timeout for the next attempt, or None when no attempt may start now."""
        now = time.monotonic()
        if now < self._down_until:
            return None
        if self._deadline is None:
            return self.config.request_timeout_s
        left = self._deadline - now
        return min(self.config.request_timeout_s, left) if left > 0.05 else None

    def _pause(self, seconds: float) -> None:
        if self._deadline is not None:
            seconds = min(seconds, max(0.0, self._deadline - time.monotonic()))
        time.sleep(seconds)

    def _to_spool(self, message: Message, without_spans: Callable[[], Message] | None = None) -> None:
        """Spool the message; past the bound, its spans are dropped (and counted) first, and
        only if even its aggregates find no room is the whole batch dropped."""
        if self.spool.write(message):
            return
        self._dropped_here += message.span_count
        self._warn_once("spool-full", "bubblescope: spool full or unwritable; dropping spans")
        if without_spans is not None and message.span_count and self.spool.write(without_spans()):
            return
        if message.path == _INGEST_PATH:
            # Keep the newest drop count on disk even now, so an upload tells the service.
            empty = wire.spans_to_columns([])
            counters = self._batch([], empty)
            self.spool.write_counters(Message("POST", _INGEST_PATH, wire.encode_batch(counters)))

    def _warn_once(self, key: str, text: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(text)
