"""tests/cpu_share.py across processes, as two xdist workers use it: a ``timing`` test's lock waits for the shared
holders and keeps new ones out until it is done; shared holders run together."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.cpu_share import LOCK_FOLDER_VARIABLE, cpu_share
from tests.support import REPO

HOLD_S = 1.5


def hold(folder: str, alone: bool, started: Path) -> subprocess.Popen[bytes]:
    """Another worker: takes the lock, says so in ``started``, holds it HOLD_S seconds."""
    code = (
        "import sys, time, pathlib\n"
        "from tests.cpu_share import cpu_share\n"
        f"with cpu_share(alone={alone}):\n"
        f"    pathlib.Path({str(started)!r}).write_text('held')\n"
        f"    time.sleep({HOLD_S})\n"
    )
    env = {**os.environ, LOCK_FOLDER_VARIABLE: folder, "PYTEST_XDIST_WORKER": "gw9"}
    other = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=REPO)
    deadline = time.monotonic() + 60
    while not started.exists():
        assert other.poll() is None and time.monotonic() < deadline, "the other worker never took the lock"
        time.sleep(0.02)
    return other


def waited_s(folder: str, alone: bool, monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setenv(LOCK_FOLDER_VARIABLE, folder)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw8")
    begun = time.monotonic()
    with cpu_share(alone=alone):
        return time.monotonic() - begun


def test_a_timing_test_waits_for_a_shared_holder_and_shared_holders_run_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        other = hold(folder, alone=False, started=Path(folder) / "shared")
        together = waited_s(folder, alone=False, monkeypatch=monkeypatch)
        alone = waited_s(folder, alone=True, monkeypatch=monkeypatch)
        other.wait(timeout=60)
    assert together < HOLD_S / 3, together  # two shared holders at once
    assert alone > HOLD_S / 3, alone  # the timing test waited for the other to finish


def test_a_shared_test_waits_for_a_timing_test(monkeypatch: pytest.MonkeyPatch) -> None:
    with tempfile.TemporaryDirectory() as folder:
        other = hold(folder, alone=True, started=Path(folder) / "alone")
        waited = waited_s(folder, alone=False, monkeypatch=monkeypatch)
        other.wait(timeout=60)
    assert waited > HOLD_S / 3, waited


def test_outside_a_worker_nothing_is_locked(monkeypatch: pytest.MonkeyPatch) -> None:
    with tempfile.TemporaryDirectory() as folder:
        other = hold(folder, alone=True, started=Path(folder) / "alone")
        monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
        monkeypatch.setenv(LOCK_FOLDER_VARIABLE, folder)
        begun = time.monotonic()
        with cpu_share(alone=True):
            waited = time.monotonic() - begun
        other.wait(timeout=60)
    assert waited < HOLD_S / 3, waited
