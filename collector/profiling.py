"""A profiler on demand: torch.profiler over the steps the service asked for (``POST /runs/{key}/profile``).

Every rank learns of the request from an ingest answer (``capture.CaptureWindows.profile_ranges``, the same
``from_step`` rule as a capture: no rank has begun it when it learns), so every rank profiles the same steps:
profiling some ranks and not others would make the rest wait for them in their collectives. Between steps, on
the training thread (``Recorder.between_steps``): before the window's first step the profiler starts (CPU, and
CUDA where the job uses it), its steps numbered as the run's (``ProfilerStep#N``, which ``bubblescope
import-trace`` reads); at each step's end it steps; after the last it stops, and a thread of its own writes the
trace, ``<profiles>/<run key>/rank<R>-steps<A>-<B>.json.gz`` beside the spool, so the training thread never waits
for the file. The ranks the request names (``upload_ranks``) then upload it from that thread
(``POST /runs/{key}/profiles/{id}``, ``TraceUploader``: the file streamed, retried while the service is busy), and the
run's page lists it; the trace stays on disk either way. Nothing here may fail the job: a torch without the
profiler, or a profiler that will not start (another one is running), is said once in the log and the request is
dropped.
"""

from __future__ import annotations

import itertools
import logging
import random
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bubblescope import wire
from bubblescope.collector.capture import CaptureWindows, ProfileWindow
from bubblescope.collector.transport import Message, Verdict, readable, send

log = logging.getLogger("bubblescope")
MAX_WRITERS = 2  # traces being written at once; a request past that is dropped (its steps are long gone)
MAX_UPLOADS = 2  # traces being uploaded at once; past that a trace stays on disk only
MAX_RESETS = 3  # streamed uploads cut off without an answer (over a limit the check did not know) before giving up
_JITTER = random.Random()  # not the job's own generator: the job's seeded draws stay its own
Upload = Callable[[Path, ProfileWindow, int], None]  # (trace, its request, rank): sends the trace to the service


@dataclass(frozen=True)
class TraceUploader:
    """Sends a profile's trace to the service. Each try first asks (``?check=true``, no body) whether the service
    has it (200: done) or waits for it (204), then streams the file from disk: an answer given before a large body
    is read reaches the sender as a reset connection. Retried while the service is busy or away, after its
    Retry-After or a doubling pause (at most a minute, jittered, so the ranks of one profile spread out), for up to
    ``give_up_after_s``; what happened is said in the log."""

    url: str
    token: str | None
    run_key: str
    timeout_s: float = 300.0
    give_up_after_s: float = 1800.0
    pause_s: float = 2.0

    def __call__(self, path: Path, window: ProfileWindow, rank: int) -> None:
        query = urllib.parse.urlencode({"rank": rank, "file": path.name})
        where = f"{wire.API_PREFIX}/runs/{self.run_key}/profiles/{window.request_id}?{query}"
        deadline = time.monotonic() + self.give_up_after_s
        size = path.stat().st_size
        resets = 0
        for attempt in itertools.count():
            check = Message("POST", f"{where}&check=true&bytes={size}", b"")
            response = send(self.url, check, self.token, self.timeout_s)
            if response.status == 204:  # the service waits for it
                with path.open("rb") as body:
                    response = send(self.url, Message("POST", where, b""), self.token, self.timeout_s, (body, size))
                resets += response.status is None  # cut off mid-body: an answer the sender never read
            if response.verdict is Verdict.DELIVERED:
                stored = response.document or {}
                log.warning("bubblescope: profile trace %s uploaded: run %s", path.name, stored.get("run_key"))
                return
            pause = response.retry_after_s
            if pause is None:  # a doubling pause, jittered
                pause = min(60.0, self.pause_s * 2 ** min(attempt, 6)) * _JITTER.uniform(0.5, 1.5)
            pause = max(self.pause_s, pause)
            if response.verdict is not Verdict.RETRY or resets >= MAX_RESETS or time.monotonic() + pause > deadline:
                break
            time.sleep(pause)
        why = response.error if not response.body else readable(response.body)
        log.warning("bubblescope: the profile trace %s was not uploaded (%s); it stays on disk", path, why)


class OnDemandProfiler:
    def __init__(self, windows: CaptureWindows, folder: Path, rank: int, upload: Upload | None = None) -> None:
        self._windows = windows
        self._folder = folder
        self._rank = rank
        self._upload = upload  # None: no service to send traces to
        self._active: tuple[Any, ProfileWindow] | None = None  # (torch profiler, its request)
        self._handled: set[int] = set()  # first steps of windows profiled or dropped
        self._busy = threading.Lock()  # guards the two counts below (writer threads change them)
        self._writing = 0  # threads exporting a trace (the profiler's events in memory)
        self._uploading = 0  # threads uploading one (the profiler released)
        self._writers: list[threading.Thread] = []

    def between_steps(self, next_step: int) -> None:
        """Called on the training thread after each step, with the number of the step about to begin."""
        try:
            if self._active is not None:
                profiler, window = self._active
                if next_step >= window.end:
                    self._active = None
                    profiler.stop()
                    self._write(profiler, window)
                else:
                    profiler.step()
            if self._active is None:
                for window in self._windows.profile_ranges:
                    if window.first == next_step and window.first not in self._handled:
                        self._handled.add(window.first)
                        self._start(window)
                        break
        except Exception as error:  # noqa: BLE001 - never into the training loop
            self._active = None
            log.warning("bubblescope: the profile asked for was dropped: %r", error)

    def _start(self, window: ProfileWindow) -> None:
        torch = sys.modules.get("torch")
        if torch is None:
            log.warning("bubblescope: a profile was asked for, but this job does not use torch: dropped")
            return
        from torch.profiler import ProfilerAction, ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            activities.append(ProfilerActivity.CUDA)
        profiler = profile(activities=activities, schedule=lambda _step: ProfilerAction.RECORD)  # steps annotated
        profiler.step_num = window.first  # ProfilerStep#N as the run numbers its steps
        profiler.start()
        self._active = (profiler, window)

    def _write(self, profiler: Any, window: ProfileWindow) -> None:
        first, last = window.first, window.end - 1
        self._writers = [writer for writer in self._writers if writer.is_alive()]
        with self._busy:
            if self._writing >= MAX_WRITERS:
                log.warning(
                    "bubblescope: profile of steps %d-%d dropped: %d traces are still being written",
                    first,
                    last,
                    MAX_WRITERS,
                )
                return
            self._writing += 1
        try:
            self._start_writer(profiler, window, first, last)
        except Exception:  # a thread that will not start: the count must not keep its place
            with self._busy:
                self._writing -= 1
            raise

    def _start_writer(self, profiler: Any, window: ProfileWindow, first: int, last: int) -> None:
        path = self._folder / f"rank{self._rank}-steps{first}-{last}.json.gz"
        upload = self._upload if self._rank in window.upload_ranks else None
        holder = [profiler]  # emptied once written: the upload does not keep the events in memory
        writer = threading.Thread(
            target=self._export, args=(holder, path, window, upload), name="bubblescope-profile", daemon=True
        )
        self._writers.append(writer)
        writer.start()

    def _export(self, holder: list[Any], path: Path, window: ProfileWindow, upload: Upload | None) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            holder.pop().export_chrome_trace(str(path))
            log.warning("bubblescope: profiled steps written to %s (bubblescope import-trace reads it)", path)
        except Exception as error:  # noqa: BLE001 - a thread of its own: nothing to fail but the trace
            log.warning("bubblescope: the profile could not be written to %s: %r", path, error)
            return
        finally:
            holder.clear()
            with self._busy:
                self._writing -= 1
        if upload is not None:
            self._send(upload, path, window)

    def _send(self, upload: Upload, path: Path, window: ProfileWindow) -> None:
        with self._busy:
            if self._uploading >= MAX_UPLOADS:
                log.warning(
                    "bubblescope: %s not uploaded: %d traces are being uploaded; it stays on disk", path, MAX_UPLOADS
                )
                return
            self._uploading += 1
        try:
            upload(path, window, self._rank)
        except Exception as error:  # noqa: BLE001 - nothing to fail but the upload
            log.warning("bubblescope: the profile trace %s could not be sent: %r", path, error)
        finally:
            with self._busy:
                self._uploading -= 1

    def join(self, timeout_s: float) -> None:
        """Wait, up to ``timeout_s`` each, for the traces being written and uploaded (at the job's end)."""
        for writer in self._writers:
            writer.join(timeout_s)
