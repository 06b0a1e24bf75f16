"""Real torchrun jobs of the demo with an injected fault, and waiting for the alerts they raise
(shared by tests/alerts/test_fault_jobs.py and bench/alert_latency.py)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psutil

from tests.support import REPO, LiveServer, migrated_database, start_server

INJECTED = re.compile(r"bubblescope-demo: injected (\S+) at step (\d+) at ([0-9.]+)")


DEMO = ("-m", "bubblescope.demo_job", "--schedule=1f1b", "--hidden=128", "--microbatches=4")
STRAGGLER_JOB = (str(REPO / "tests" / "stragglers" / "straggler_job.py"),)  # four ranks, --slow=RANK:FACTOR


def launch(
    url: str,
    run_key: str,
    ranks: int,
    *args: str,
    watchdog_s: float = 1.0,
    job: tuple[str, ...] = DEMO,
    restarts: int = 0,
) -> subprocess.Popen[str]:
    """``job`` (the demo pipeline by default) under torchrun, streaming into ``url``; its own session."""
    env = {
        **os.environ,
        "BUBBLESCOPE_URL": url,
        "BUBBLESCOPE_RUN_ID": run_key,
        "BUBBLESCOPE_FLUSH_INTERVAL_S": "0.2",
        "BUBBLESCOPE_WATCHDOG_AFTER_S": str(watchdog_s),
        "OMP_NUM_THREADS": "1",
    }
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    command += [f"--max-restarts={restarts}", *job, *args]
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=REPO
    )


def kill_job(process: subprocess.Popen[str]) -> None:
    """SIGKILL torchrun and every worker (they run in sessions of their own: a process group kill misses them)."""
    try:
        tree = psutil.Process(process.pid)
        members = [*tree.children(recursive=True), tree]
    except psutil.NoSuchProcess:
        return
    for member in members:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    psutil.wait_procs(members, timeout=30)


def alerts(client: httpx.Client, run_key: str) -> list[dict[str, Any]]:
    response = client.get("/api/v1/alerts", params={"run": run_key})
    if response.status_code == 404:  # not registered yet
        return []
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()["alerts"]
    return found


def wait_for(client: httpx.Client, run_key: str, name: str, status: str, timeout_s: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    seen: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        seen = alerts(client, run_key)
        for alert in seen:
            if alert["labels"]["alertname"] == name and alert["status"] == status:
                return alert
        time.sleep(0.5)
    raise AssertionError(f"no {status} {name} for {run_key} in {timeout_s} s; alerts: {seen}")


def finish(process: subprocess.Popen[str], timeout_s: float = 180) -> str:
    """The job's output once it ends; killed (all of it) if it has not within ``timeout_s``."""
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_job(process)
        output, _ = process.communicate(timeout=60)
    return output


def injected_at(output: str) -> float | None:
    """The wall-clock time the job's fault was injected (the line ``demo_faults`` prints)."""
    found = INJECTED.search(output)
    return float(found.group(3)) if found else None


FAULT_SERVE = ["--hung-after", "4", "--alert-interval", "1", "--silent-after", "60"]
"""serve's options for jobs with injected faults: a run is hung after 4 s without a step, rules every second."""


def fault_service(factory: Any) -> Iterator[LiveServer]:
    """A service of its own (SQLite, ``FAULT_SERVE``) for a test module's fault jobs; ``factory``: pytest's
    ``tmp_path_factory``."""
    with migrated_database("sqlite", factory.mktemp("db")) as url:
        live = start_server(url, factory.mktemp("server"), extra_args=FAULT_SERVE)
        yield live
        live.stop()
