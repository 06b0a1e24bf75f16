"""The alert rules' costly figures (bubble against its floor, persistent stragglers, regression) computed
in a child process (``figure_worker``) are the figures computed in the serving process, and the child is
another process, which comes back after it dies. A synthetic 1F1B run with a slow rank, sent over HTTP to
a real service; SQLite and PostgreSQL (the ``server`` fixture)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import psutil
import pytest

from bubblescope.analysis.alert_rules import Thresholds
from bubblescope.backend.db.engine import build_engine, build_session_factory, transaction
from bubblescope.backend.derived.figure_worker import FigureWorker
from bubblescope.backend.derived.figures import FigureRequest, compute_figures
from bubblescope.backend.store.runs import find_run
from bubblescope.synthetic_run import SyntheticJob, register_job, send_job
from tests.support import LiveServer, migrated_database

JOB = SyntheticJob(stages=2, replicas=2, microbatches=4, steps=20, slow=((1, 1.5),))
THRESHOLDS = Thresholds(
    silent_after_s=60, hung_after_s=60, regression_percent=25, regression_for_s=300,
    bubble_over_floor_points=5, bubble_for_steps=10,
)  # fmt: skip


def _workers() -> set[int]:
    """This process's spawned workers: not multiprocessing's resource tracker, also a child, nor the
    server's own figure worker, a grandchild."""
    children = psutil.Process().children(recursive=False)
    return {child.pid for child in children if "spawn_main" in " ".join(child.cmdline())}


def test_figures_from_the_child_process_are_the_ones_computed_in_process(server: LiveServer) -> None:
    key = f"figures-{uuid.uuid4().hex[:8]}"
    with server.client() as client:
        register_job(client, JOB, key, senders=2)
        send_job(client, JOB, key, steps_per_batch=5, senders=2)
    sessions = build_session_factory(build_engine(server.db_url))
    with transaction(sessions) as session:
        run = find_run(session, key)
        assert run is not None
        asked = FigureRequest(run.id, key, JOB.steps - 1, None, None, THRESHOLDS)
        here = compute_figures(session, asked)
    assert here.bubble is not None, "the synthetic pipeline run has a bubble and a floor"
    assert here.stragglers and 1 in here.stragglers[0].ranks, here.stragglers

    worker = FigureWorker(server.db_url)
    before = _workers()
    try:
        assert worker.compute(asked) == here
        child = _workers() - before
        assert child and os.getpid() not in child, "computed in a child process"
        psutil.Process(child.pop()).kill()  # the child dies: this refresh fails, the next starts another
        with pytest.raises(BrokenProcessPool):
            worker.compute(asked)
        assert worker.compute(asked) == here
    finally:
        worker.close()


PARENT = """
import os, sys
from bubblescope.analysis.alert_rules import Thresholds
from bubblescope.backend.derived.figure_worker import FigureWorker
from bubblescope.backend.derived.figures import FigureRequest
t = Thresholds(60, 60, 25, 300, 5, 10)
worker = FigureWorker(sys.argv[1])
worker.compute(FigureRequest(1, "no-such-run", 5, None, None, t))  # starts the child
print(worker._pool._processes and list(worker._pool._processes)[0], flush=True)
os._exit(0)  # as a SIGKILL would: no shutdown reaches the pool
"""


def test_the_worker_ends_when_its_service_is_killed(tmp_path: Path) -> None:
    with migrated_database("sqlite", tmp_path) as url:
        done = subprocess.run([sys.executable, "-c", PARENT, url], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        child = psutil.Process(int(done.stdout.strip()))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and child.is_running() and child.status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.2)
        assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE, "the orphaned worker lives on"
