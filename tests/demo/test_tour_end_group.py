"""The tour ends a job whole: torchrun starts each worker in a session of its own (torch's SubprocessHandler,
``start_new_session=True``), so killing torchrun's process group alone leaves a hung worker running. Here a parent
started as the tour starts torchrun starts a child as torchrun starts a worker; ``end_group`` must end both."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from bubblescope.tour import end_group

PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
print(child.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def test_a_worker_in_its_own_session_ends_with_the_job() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, start_new_session=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert os.getpgid(child) == child != os.getpgid(parent.pid)  # its own group, as torchrun's workers
    end_group(parent)
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)
