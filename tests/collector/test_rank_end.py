"""How a real process's end reaches the service: ``shutdown()`` in a ``finally`` while an exception
propagates, an uncaught exception after a second ``init``, and a clean exit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from typing import Any

import pytest

from tests.support import REPO, LiveServer

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
    ),
    "clean exit": (
        """
        with collector.step():
            pass
        """,
        "finished",
        None,
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
    ),
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_the_rank_reports_how_its_process_ended(sqlite_server: LiveServer, ending: str) -> None:
    body, outcome, error = ENDINGS[ending]
    run_key = f"end-{uuid.uuid4().hex[:8]}"
    script = "import sys\nfrom bubblescope import collector\ncollector.init(run='end-test')\n" + textwrap.dedent(body)
    env = {**os.environ, "BUBBLESCOPE_URL": sqlite_server.url, "BUBBLESCOPE_RUN_ID": run_key}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert (done.returncode == 0) == (outcome == "finished"), done.stderr[-3000:]
    if error is not None:
        assert error in done.stderr  # the previous excepthook still printed the traceback
        assert done.stderr.count("Traceback") == 1, done.stderr
    with sqlite_server.client() as client:
        run: dict[str, Any] = client.get(f"/api/v1/runs/{run_key}").json()
    assert (run["ranks"][0]["outcome"], run["ranks"][0]["error"]) == (outcome, error), run["ranks"]
    assert run["state"] == ("finished" if outcome == "finished" else "failed")
