"""A profiler on demand: torch.profiler over the steps the service asked for (``POST /runs/{key}/profile``).

Every rank learns of the request from an ingest answer (``capture.CaptureWindows.profile_ranges``, the same
``from_step`` rule as a capture: no rank has begun it when it learns), so every rank profiles the same steps:
profiling some ranks and not others would make the rest wait for them in their collectives. Between steps, on
the training thread (``Recorder.between_steps``): before the window's first step the profiler starts (CPU, and
CUDA where the job uses it), its steps numbered as the run's (``ProfilerStep#N``, which ``bubblescope
import-trace`` reads); at each step's end it steps; after the last it stops, and a thread of its own writes the
trace, ``<profiles>/<run key>/rank<R>-steps<A>-<B>.json.gz`` beside the spool, so the training thread never waits
for the file. Nothing here may fail the job: a torch without the profiler, or a profiler that will not start
(another one is running), is said once in the log and the request is dropped.
"""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path
from typing import Any

from bubblescope.collector.capture import CaptureWindows

log = logging.getLogger("bubblescope")
MAX_WRITERS = 2  # traces being written at once; a request past that is dropped (its steps are long gone)


class OnDemandProfiler:
    def __init__(self, windows: CaptureWindows, folder: Path, rank: int) -> None:
        self._windows = windows
        self._folder = folder
        self._rank = rank
        self._active: tuple[Any, int, int] | None = None  # (torch profiler, first step, end step)
        self._handled: set[int] = set()  # first steps of windows profiled or dropped
        self._writers: list[threading.Thread] = []

    def between_steps(self, next_step: int) -> None:
        """Called on the training thread after each step, with the number of the step about to begin."""
        try:
            if self._active is not None:
                profiler, first, end = self._active
                if next_step >= end:
                    self._active = None
                    profiler.stop()
                    self._write(profiler, first, end - 1)
                else:
                    profiler.step()
            if self._active is None:
                for first, end in self._windows.profile_ranges:
                    if first == next_step and first not in self._handled:
                        self._handled.add(first)
                        self._start(first, end)
                        break
        except Exception as error:  # noqa: BLE001 - never into the training loop
            self._active = None
            log.warning("bubblescope: the profile asked for was dropped: %r", error)

    def _start(self, first: int, end: int) -> None:
        torch = sys.modules.get("torch")
        if torch is None:
            log.warning("bubblescope: a profile was asked for, but this job does not use torch: dropped")
            return
        from torch.profiler import ProfilerAction, ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            activities.append(ProfilerActivity.CUDA)
        profiler = profile(activities=activities, schedule=lambda _step: ProfilerAction.RECORD)  # steps annotated
        profiler.step_num = first  # ProfilerStep#N as the run numbers its steps
        profiler.start()
        self._active = (profiler, first, end)

    def _write(self, profiler: Any, first: int, last: int) -> None:
        self._writers = [writer for writer in self._writers if writer.is_alive()]
        if len(self._writers) >= MAX_WRITERS:
            log.warning(
                "bubblescope: profile of steps %d-%d dropped: %d traces are still being written",
                first,
                last,
                MAX_WRITERS,
            )
            return
        path = self._folder / f"rank{self._rank}-steps{first}-{last}.json.gz"
        writer = threading.Thread(target=self._export, args=(profiler, path), name="bubblescope-profile", daemon=True)
        self._writers.append(writer)
        writer.start()

    def _export(self, profiler: Any, path: Path) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            profiler.export_chrome_trace(str(path))
            log.warning("bubblescope: profiled steps written to %s (bubblescope import-trace reads it)", path)
        except Exception as error:  # noqa: BLE001 - a thread of its own: nothing to fail but the trace
            log.warning("bubblescope: the profile could not be written to %s: %r", path, error)

    def join(self, timeout_s: float) -> None:
        """Wait, up to ``timeout_s`` each, for the traces being written (at the job's end)."""
        for writer in self._writers:
            writer.join(timeout_s)
