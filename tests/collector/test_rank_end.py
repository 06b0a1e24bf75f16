"""How a real process's end reaches the service: ``shutdown()`` in a ``finally`` while an exception
propagates, an uncaught exception after a second ``init``, Ctrl-C, a clean exit, and
``sys.exit(1)`` (finished: an exit code is not visible to the collector, a documented limit)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO, LiveServer, wait_until

ENDINGS = {
    "finally": (
        """
        try:
            with collector.step():
                raise ValueError("loss is nan")
        finally:
            collector.shutdown()
        """,
        "failed",
        "ValueError: loss is nan",
        1,
    ),
    "reinit then uncaught": (
        """
        collector.shutdown()
        collector.init(run="end-test")  # a second session, whose re-registration cleared the first end
        with collector.step():
            pass
        raise KeyError("missing batch")
        """,
        "failed",
        "KeyError: 'missing batch'",
        1,
    ),
    "clean exit": (
        """
        with collector.step():
            pass
        """,
        "finished",
        None,
        0,
    ),
    "sys.exit(0) in finally": (
        """
        try:
            sys.exit(0)
        finally:
            collector.shutdown()
        """,
        "finished",
        None,
        0,
    ),
    # README (Run states): an exit code is not visible to an atexit hook, so this reads finished
    "sys.exit(1)": (
        """
        with collector.step():
            pass
        sys.exit(1)
        """,
        "finished",
        None,
        1,
    ),
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_the_rank_reports_how_its_process_ended(sqlite_server: LiveServer, ending: str) -> None:
    body, outcome, error, returncode = ENDINGS[ending]
    run_key = f"end-{uuid.uuid4().hex[:8]}"
    script = "import sys\nfrom bubblescope import collector\ncollector.init(run='end-test')\n" + textwrap.dedent(body)
    env = {**os.environ, "BUBBLESCOPE_URL": sqlite_server.url, "BUBBLESCOPE_RUN_ID": run_key}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == returncode, done.stderr[-3000:]
    if error is not None:
        assert error in done.stderr  # the previous excepthook still printed the traceback
        assert done.stderr.count("Traceback") == 1, done.stderr
    with sqlite_server.client() as client:
        run: dict[str, Any] = client.get(f"/api/v1/runs/{run_key}").json()
    assert (run["ranks"][0]["outcome"], run["ranks"][0]["error"]) == (outcome, error), run["ranks"]
    assert run["state"] == ("finished" if outcome == "finished" else "failed")


CTRL_C_SCRIPT = """
import itertools, sys, time
from pathlib import Path
from bubblescope import collector
collector.init(run="end-test")
for step in itertools.count():
    with collector.step():
        time.sleep(0.01)
    if step == 3:
        Path(sys.argv[1]).write_text("looping")
"""


def test_ctrl_c_in_the_training_loop_fails_the_run(sqlite_server: LiveServer, tmp_path: Path) -> None:
    """A real SIGINT (what Ctrl-C sends) to a process in its loop: the uncaught KeyboardInterrupt
    ends it, and the run is failed with that error (README, Run states)."""
    run_key = f"end-{uuid.uuid4().hex[:8]}"
    looping = tmp_path / "looping"
    # PYTHONFAULTHANDLER: should the process outlive the wait below, SIGABRT prints every thread's stack
    env = {**os.environ, "BUBBLESCOPE_URL": sqlite_server.url, "BUBBLESCOPE_RUN_ID": run_key, "PYTHONFAULTHANDLER": "1"}
    process = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_SCRIPT, str(looping)],
        # as a terminal starts a job: a shell without job control starts a background command (nohup ... &, a CI
        # runner's) with SIGINT ignored, its children inherit that, and Python then raises no KeyboardInterrupt
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(looping.exists, 60, "the loop to run")
        process.send_signal(signal.SIGINT)
        try:
            _, stderr = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # where each thread was
            process.send_signal(signal.SIGABRT)
            _, stderr = process.communicate(timeout=30)
            pytest.fail(f"still running 60 s after SIGINT; its threads at SIGABRT:\n{stderr[-8000:]}")
    finally:
        process.kill()
    assert process.returncode != 0 and "KeyboardInterrupt" in stderr, stderr[-3000:]
    with sqlite_server.client() as client:
        run: dict[str, Any] = client.get(f"/api/v1/runs/{run_key}").json()
    assert (run["ranks"][0]["outcome"], run["ranks"][0]["error"]) == ("failed", "KeyboardInterrupt"), run["ranks"]
    assert run["state"] == "failed" and run["state_detail"] == "rank 0 failed: KeyboardInterrupt", run
