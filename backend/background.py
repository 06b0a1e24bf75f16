"""The service's own clocks: work that runs every few seconds whether or not anyone asks.

Each ``PeriodicTask`` is a daemon thread that calls its function, then waits its interval (or
until woken early by ``wake``), from the app's start to its shutdown. A function that raises is
logged and called again next time: one bad round never stops alert evaluation or delivery.
Registered in ``create_app`` (alert rules, alert delivery, retention); started by the lifespan. With
several processes on one PostgreSQL database, only the leader runs them (``leadership``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI

from bubblescope.backend.leadership import Leadership

log = logging.getLogger("bubblescope.background")

STOP_WAIT_S = 5.0


class PeriodicTask:
    def __init__(
        self, name: str, interval_s: float, work: Callable[[], None], min_gap_s: Callable[[], float] | None = None
    ) -> None:
        """``min_gap_s``: the least pause after a round before news may start the next (a costly round woken by
        every ingest would otherwise run back to back)."""
        self.name = name
        self.interval_s = interval_s
        self.work = work
        self.min_gap_s = min_gap_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.leads: Callable[[], bool] = lambda: True  # set by BackgroundTasks.add: run only in the leader

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"bubblescope-{self.name}", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Run the work now instead of at the end of the interval (an ingest just changed a run)."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(STOP_WAIT_S)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                if self.leads():
                    self.work()
            except Exception:
                log.exception("bubblescope: %s round failed; retrying in %.0f s", self.name, self.interval_s)
            if self.min_gap_s is not None:
                self._stop.wait(self.min_gap_s())  # news arriving meanwhile stays set: the next round follows it
            self._wake.wait(self.interval_s)


class BackgroundTasks:
    """The app's periodic tasks, by name; each round runs only in the deployment's leader process.

    ``news()`` is how a feature says a run changed (a batch stored, a rank ended) without knowing who
    cares: it wakes every task added with ``on_news=True`` (the alert rules)."""

    def __init__(self, leadership: Leadership) -> None:
        self.tasks: dict[str, PeriodicTask] = {}
        self.leadership = leadership
        self.stoppers: list[Callable[[], None]] = []  # run after the tasks stop (a child process to end)
        self._on_news: list[PeriodicTask] = []

    def on_stop(self, stopper: Callable[[], None]) -> None:
        self.stoppers.append(stopper)

    def add(self, task: PeriodicTask, on_news: bool = False, every_process: bool = False) -> PeriodicTask:
        """Run ``task`` from the app's start; ``on_news``: also whenever ``news()`` is called; ``every_process``:
        in every process, not only the leader (work whose result stays in the process's memory)."""
        if not every_process:
            task.leads = self.leadership.leads
        self.tasks[task.name] = task
        if on_news:
            self._on_news.append(task)
        return task

    def news(self) -> None:
        """A run changed: wake the tasks that watch for it."""
        for task in self._on_news:
            task.wake()

    def wake(self, name: str) -> None:
        task = self.tasks.get(name)
        if task is not None:
            task.wake()


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Start the app's periodic tasks with the server, stop them with it."""
    background: BackgroundTasks = app.state.background
    for task in background.tasks.values():
        task.start()
    try:
        yield
    finally:
        for task in background.tasks.values():
            task.stop()
        for stopper in background.stoppers:
            stopper()
        background.leadership.release()  # another process takes the lead at its next round
