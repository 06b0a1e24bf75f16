"""Two pytest-xdist workers share this machine's cores; a test marked ``timing`` has them to itself.

A ``timing`` test reads figures a busy machine moves (a bubble's share of the step, a straggler's excess, a
hang's silence, a collector's overhead), with margins that hold on a loaded 2-core machine, not on one running a second
test beside it. Every other test (a server's answers, a job's spans, a page's cards) runs beside another.

Each test holds one lock for its whole protocol (the module and session fixtures it sets up, its call, its
teardown): shared, or exclusive for a ``timing`` test. A worker waiting for the exclusive lock first takes a
turnstile that any new holder must pass, so a stream of shared tests cannot starve it. Run without workers (``-n 0``),
nothing is locked.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: The folder the workers lock in, made by the controller before it starts them (they inherit its environment).
LOCK_FOLDER_VARIABLE = "BUBBLESCOPE_TEST_LOCKS"


def make_lock_folder() -> None:
    """On the controller: a folder for this run's locks, named to the workers through the environment."""
    os.environ[LOCK_FOLDER_VARIABLE] = tempfile.mkdtemp(prefix="bubblescope-tests-")


def remove_lock_folder() -> None:
    """On the controller, after the run: the lock files go."""
    shutil.rmtree(os.environ.pop(LOCK_FOLDER_VARIABLE, ""), ignore_errors=True)


@contextmanager
def cpu_share(alone: bool) -> Iterator[None]:
    """Hold the cores shared with the other worker, or (``alone``) to this test only. Outside a worker, no lock."""
    folder = os.environ.get(LOCK_FOLDER_VARIABLE)
    if not folder or not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    with open(Path(folder) / "turnstile", "a") as turnstile, open(Path(folder) / "cores", "a") as cores:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(cores, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(cores, fcntl.LOCK_UN)
